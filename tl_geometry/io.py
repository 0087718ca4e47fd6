"""Results on disk: one safetensors file of tensors plus JSON metadata (never pickle), written
atomically; the names of heads and the digest of token windows."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch import Tensor

from .errors import TLGeometryError

__all__ = ["save_tensors", "load_tensors", "atomic_path", "head_name", "token_digest"]


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed onto ``path`` when the block ends
    without an error (a reader sees the old file or the new one, never half of one)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_tensors(path: str | Path, kind: str, tensors: dict[str, Tensor], **metadata: Any) -> None:
    """Write ``tensors`` to ``path`` (atomically) with ``kind`` and JSON-encoded ``metadata``."""
    from safetensors.torch import save_file

    meta = {"kind": kind, **{key: json.dumps(value) for key, value in metadata.items()}}
    with atomic_path(path) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=meta)


def load_tensors(path: str | Path, kind: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Tensors and decoded metadata of a file written by :func:`save_tensors`; a missing,
    unreadable or truncated file, or one of another kind, raises :class:`TLGeometryError`."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            if meta.get("kind") != kind:
                raise TLGeometryError(f"{path} does not hold a {kind} (kind={meta.get('kind')!r}).")
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 - safe_open has no __iter__
        decoded = {key: json.loads(value) for key, value in meta.items() if key != "kind"}
    except (SafetensorError, OSError, ValueError) as exc:
        if isinstance(exc, TLGeometryError):
            raise
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise TLGeometryError(f"cannot read {path} ({reason}): the file is missing, truncated or not written by "
                              "tl_geometry; rerun the step that wrote it") from None
    return tensors, decoded


def head_name(layer: int, head: int) -> str:
    """The name of a head in every table and plot: ``L{layer}H{head}``."""
    return f"L{layer}H{head}"


def token_digest(tokens: Tensor, mask: Tensor | None = None) -> str:
    """SHA-256 of token ids (and the attention mask) on any device: the key of resumable runs."""
    import hashlib

    digest = hashlib.sha256(tokens.detach().cpu().numpy().tobytes())
    if mask is not None:
        digest.update(mask.detach().cpu().numpy().tobytes())
    return digest.hexdigest()
