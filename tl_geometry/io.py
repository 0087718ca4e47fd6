"""Results on disk: one safetensors file of tensors plus JSON metadata (never pickle), written
atomically; the names of heads and the digest of token windows."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, SupportsIndex

import torch
from torch import Tensor

from .errors import TLGeometryError

__all__ = ["save_tensors", "load_tensors", "atomic_path", "head_name", "layer_spans", "parse_heads", "parse_head", "token_digest", "sha256_file", "manifest_files",
           "check_sealed", "MARKER", "MANIFEST"]

# A run folder's marker (tl-geometry owns the folder) and its manifest (the finished analysis's
# files with sizes and checksums, written last); run_folder.RunFolder writes both.
MARKER = ".tl-geometry"
MANIFEST = "manifest.json"


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed onto ``path`` when the block ends
    without an error (a reader sees the old file or the new one, never half of one)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as exc:  # a read-only folder, a full disk: the user's to fix, and the old file is intact
        raise TLGeometryError(f"cannot write {path} ({exc.strerror or exc}): check that {str(path.parent)!r} is a "
                              "writable folder with free space") from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # nothing was written there (the folder refused it)


def save_tensors(path: str | Path, kind: str, tensors: dict[str, Tensor], **metadata: Any) -> None:
    """Write ``tensors`` to ``path`` (atomically) with ``kind`` and JSON-encoded ``metadata``."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    meta = {"kind": kind, **{key: json.dumps(value) for key, value in metadata.items()}}
    with atomic_path(path) as tmp:
        try:
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=meta)
        except SafetensorError as exc:  # its I/O errors (a full disk) are the user's to fix, as OSErrors are
            if "I/O error" not in str(exc):
                raise
            raise OSError(str(exc).removeprefix("Error while serializing: ")) from None


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


def sha256_file(path: str | Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest_files(folder: str | Path) -> dict[str, dict[str, Any]]:
    """``{name: {"bytes", "sha256"}}`` of a run folder's manifest ({} when absent or malformed)."""
    try:
        files = json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    valid = isinstance(files, dict) and all(
        isinstance(e, dict) and isinstance(e.get("bytes"), int) and isinstance(e.get("sha256"), str) for e in files.values())
    return files if valid else {}


def check_sealed(folder: str | Path) -> None:
    """A folder that tl-geometry marked must hold a finished analysis whose files match its
    manifest; one :class:`TLGeometryError` says what is wrong. Unmarked folders (written before
    markers, or by ``Analysis.save``) are not checked."""
    folder = Path(folder)
    if not (folder / MARKER).is_file():
        if not ((folder / "geometry.safetensors").is_file() or (folder / "taxonomy.safetensors").is_file()):
            raise TLGeometryError(f"{str(folder)!r} is not a finished run folder (no geometry/taxonomy results): "
                                  "run tl-geometry analyze first")
        return
    files = manifest_files(folder)
    if not files:
        if (folder / "geometry.safetensors").is_file() or (folder / "taxonomy.safetensors").is_file():
            raise TLGeometryError(f"{str(folder)!r} was interrupted while saving its results: rerun the same "
                                  "tl-geometry analyze command with --resume")
        raise TLGeometryError(f"{str(folder)!r} is not a finished run folder (no geometry/taxonomy results): "
                              "run tl-geometry analyze first")
    for name, entry in files.items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != entry["bytes"] or sha256_file(path) != entry["sha256"]:
            raise TLGeometryError(f"cannot read {path} (missing, or its size or checksum differs from {MANIFEST}: "
                                  "damaged or changed after the run wrote it): rerun tl-geometry analyze with --overwrite")


def head_name(layer: SupportsIndex, head: SupportsIndex) -> str:
    """The name of a head in every table and plot: ``L{layer}H{head}``."""
    return f"L{int(layer)}H{int(head)}"


def layer_spans(layers: list[int]) -> str:
    """Layers as runs: ``[0, 1, 2, 4]`` as ``"layers 0–2, 4"``.

    >>> layer_spans([0, 1, 2, 4]), layer_spans([7])
    ('layers 0–2, 4', 'layer 7')
    """
    spans: list[list[int]] = []
    for layer in sorted(layers):
        if spans and layer == spans[-1][1] + 1:
            spans[-1][1] = layer
        else:
            spans.append([layer, layer])
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in spans)


_HEAD_NAME = re.compile(r"L(\d+)H(\d+)")
_HEADS_HELP = ("heads are (layer, head) pairs, 'L3H4' names, flat indices layer·n_heads + head (a list or an "
               "integer tensor, as topk over a [n_layers, n_heads] tensor gives) or a boolean [n_layers, n_heads] mask")


def _integer(x: Any) -> int | None:
    if isinstance(x, bool) or (isinstance(x, torch.Tensor) and (x.numel() != 1 or x.is_floating_point()
                                                                  or x.dtype == torch.bool)):
        return None
    return int(x) if hasattr(x, "__index__") else None


def parse_heads(heads: Any, n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """Heads in TransformerLens's conventions as ``(layer, head)`` pairs, checked against the model's
    ``n_layers × n_heads``: a pair, an ``"L3H4"`` name or a flat index each (in a list), an integer
    tensor of flat indices or of pairs ``[k, 2]``, a boolean ``[n_layers, n_heads]`` mask, or one
    name or flat index alone. A bare tuple of two integers is refused (one head, or two flat
    indices?): write ``[(3, 4)]`` or ``[3, 4]``.

    >>> parse_heads(["L1H2", (0, 1), 5], n_layers=2, n_heads=4)
    [(1, 2), (0, 1), (1, 1)]
    """
    if isinstance(heads, torch.Tensor):
        if heads.dtype == torch.bool:
            if tuple(heads.shape) != (n_layers, n_heads):
                raise TLGeometryError(f"a boolean head mask must be [n_layers, n_heads] = [{n_layers}, {n_heads}]; "
                                      f"got {list(heads.shape)}.")
            return [(int(layer), int(head)) for layer, head in heads.nonzero().tolist()]
        if heads.is_floating_point() or heads.ndim > 2 or (heads.ndim == 2 and heads.shape[1] != 2):
            raise TLGeometryError(f"{_HEADS_HELP}; got a {heads.dtype} tensor of shape {list(heads.shape)}.")
        heads = heads.tolist() if heads.ndim else [int(heads)]
    elif isinstance(heads, str) or _integer(heads) is not None:
        heads = [heads]
    elif isinstance(heads, tuple) and len(heads) == 2 and all(_integer(x) is not None for x in heads):
        raise TLGeometryError(f"heads={heads!r} is ambiguous: write [{heads!r}] for head L{heads[0]}H{heads[1]}, or "
                              f"[{heads[0]}, {heads[1]}] for two flat indices.")
    if isinstance(heads, bytes) or not isinstance(heads, Iterable):
        raise TLGeometryError(f"{_HEADS_HELP}; got {heads!r}.")
    return [_one_head(item, n_layers, n_heads) for item in heads]


def parse_head(head: Any, n_layers: int, n_heads: int) -> tuple[int, int]:
    """One head as ``(layer, head)``: a pair, an ``"L3H4"`` name or a flat index (or a list or
    tensor that holds exactly one of them)."""
    if isinstance(head, tuple) and len(head) == 2:
        head = [head]  # one pair, not two flat indices: a single head was asked for
    heads = parse_heads(head, n_layers, n_heads)
    if len(heads) != 1:
        raise TLGeometryError(f"one head is asked for here (a (layer, head) pair, 'L3H4' or a flat index); got "
                              f"{len(heads)}: {head!r}.")
    return heads[0]


def _one_head(item: Any, n_layers: int, n_heads: int) -> tuple[int, int]:
    match = _HEAD_NAME.fullmatch(item) if isinstance(item, str) else None
    flat = _integer(item)
    if match is not None:
        pair = int(match[1]), int(match[2])
    elif flat is not None:
        if not 0 <= flat < n_layers * n_heads:
            raise TLGeometryError(f"flat head index {flat} is out of range for {n_layers} layers × {n_heads} heads.")
        pair = divmod(flat, n_heads)
    elif isinstance(item, tuple | list | torch.Tensor) and len(item) == 2 and None not in map(_integer, item):
        pair = int(item[0]), int(item[1])
    else:
        raise TLGeometryError(f"{_HEADS_HELP}; got {item!r}.")
    if not (0 <= pair[0] < n_layers and 0 <= pair[1] < n_heads):
        raise TLGeometryError(f"head {pair} is out of range for {n_layers} layers × {n_heads} heads.")
    return pair


def token_digest(tokens: Tensor, mask: Tensor | None = None) -> str:
    """SHA-256 of token ids (and the attention mask) on any device: the key of resumable runs."""
    import hashlib

    digest = hashlib.sha256(tokens.detach().cpu().numpy().tobytes())
    if mask is not None:
        digest.update(mask.detach().cpu().numpy().tobytes())
    return digest.hexdigest()
