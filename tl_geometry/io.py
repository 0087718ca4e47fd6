"""Results on disk: one safetensors file of tensors plus JSON metadata (never pickle)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import Tensor

__all__ = ["save_tensors", "load_tensors", "head_name", "token_digest"]


def save_tensors(path: str | Path, kind: str, tensors: dict[str, Tensor], **metadata: Any) -> None:
    """Write ``tensors`` to ``path`` with ``kind`` and JSON-encoded ``metadata``."""
    from safetensors.torch import save_file

    meta = {"kind": kind, **{key: json.dumps(value) for key, value in metadata.items()}}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=meta)


def load_tensors(path: str | Path, kind: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Tensors and decoded metadata of a file written by :func:`save_tensors`; refuses another kind."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
        if meta.get("kind") != kind:
            raise ValueError(f"{path} does not hold a {kind} (kind={meta.get('kind')!r}).")
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 - safe_open has no __iter__
    return tensors, {key: json.loads(value) for key, value in meta.items() if key != "kind"}


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
