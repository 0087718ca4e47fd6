"""Results on disk: one safetensors file of tensors plus JSON metadata (never pickle), written
atomically; run-folder manifests; the digest of token windows."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch import Tensor

from .errors import TLGeometryError

__all__ = ["save_tensors", "load_tensors", "tensor_file_kind", "atomic_path", "atomic_folder", "staged", "Staging", "token_digest", "sha256_file",
           "is_plain_name", "manifest_files", "check_sealed", "MARKER", "MANIFEST"]

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


@contextmanager
def atomic_folder(folder: str | Path) -> Iterator[Path]:
    """A new temporary folder beside ``folder`` to fill; it replaces ``folder`` when the block ends
    without an error (a reader never sees a half-written folder). ``OSError`` before the block runs
    when the parent cannot be written."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        yield tmp
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class Staging:
    """New versions of a folder's files written under temporary names (``.name.staged``) and swapped
    onto their names together by :meth:`commit`; see :func:`staged`."""

    def __init__(self, folder: Path):
        self.folder, self.names = folder, []

    def file(self, name: str) -> Path:
        """The temporary name the new ``name`` is staged under."""
        return self.folder / f".{name}.staged"

    def path(self, name: str) -> Path:
        """Where to write the new ``name`` (it is staged from now on)."""
        self.names.append(name)
        return self.file(name)

    def commit(self) -> None:
        """Every staged file onto its name (renames in one folder: each atomic, all quick)."""
        for name in self.names:
            os.replace(self.file(name), self.folder / name)
        self.names = []


@contextmanager
def staged(folder: str | Path) -> Iterator[Staging]:
    """Stage new versions of a folder's files; until :meth:`Staging.commit` the folder's own files are
    untouched, and an error (a full disk, Ctrl-C) removes what was staged: the old files stay whole."""
    staging = Staging(Path(folder))
    try:
        yield staging
    finally:
        for name in staging.names:
            try:
                staging.file(name).unlink(missing_ok=True)
            except OSError:
                pass


def _new_file_mode() -> int:
    """The mode a new file gets from the user's umask (read without changing it, as
    ``os.umask`` would for a moment for every thread), 0o644 where it cannot be read."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o644


def save_tensors(path: str | Path, kind: str, tensors: dict[str, Tensor], **metadata: Any) -> None:
    """Write ``tensors`` to ``path`` (atomically) with ``kind`` and JSON-encoded ``metadata``."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    meta = {"kind": kind, **{key: json.dumps(value) for key, value in metadata.items()}}
    with atomic_path(path) as tmp:
        try:
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=meta)
            os.chmod(tmp, _new_file_mode())  # safetensors creates 0600; every other result file has the umask's mode
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


def tensor_file_kind(path: str | Path) -> str | None:
    """The ``kind`` a :func:`save_tensors` file records (its header only), or None for a missing
    file, another file or another writer's safetensors: what a result *is*, not what it is called."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            kind = (fh.metadata() or {}).get("kind")
    except (SafetensorError, OSError, ValueError):
        return None
    return kind if isinstance(kind, str) else None


def sha256_file(path: str | Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_plain_name(name: object) -> bool:
    """Whether ``name`` is a file name that stays in its folder: no separator, not ``.`` or ``..``,
    not absolute, no NUL (what a manifest or any file list read from disk may name)."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name
            and "\0" not in name and Path(name).name == name)


def manifest_files(folder: str | Path) -> dict[str, dict[str, Any]]:
    """``{name: {"bytes", "sha256"}}`` of a run folder's manifest ({} when absent or malformed). A
    manifest that names anything but a plain file name of the folder (``../x``, an absolute path) is
    refused: the folder's files are never looked for, checked or removed outside it."""
    try:
        files = json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    valid = isinstance(files, dict) and all(
        isinstance(e, dict) and isinstance(e.get("bytes"), int) and isinstance(e.get("sha256"), str) for e in files.values())
    if not valid:
        return {}
    outside = [name for name in files if not is_plain_name(name)]
    if outside:
        raise TLGeometryError(f"{str(Path(folder) / MANIFEST)!r} names {outside[0]!r}, which is not a file of that "
                              "folder: the manifest was edited or comes from elsewhere, and nothing was changed; move "
                              "the folder aside and rerun tl-geometry analyze into a new one")
    return files


def check_sealed(folder: str | Path) -> None:
    """A folder that tl-geometry marked, or that holds a manifest (a copy made without the hidden
    marker), must hold a finished analysis whose files match the manifest; one
    :class:`TLGeometryError` says what is wrong. Folders with neither (written before markers) are
    not checked."""
    folder = Path(folder)
    if not (folder / MARKER).is_file() and not (folder / MANIFEST).is_file():  # a copy without the marker: checked
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


def token_digest(tokens: Tensor, mask: Tensor | None = None) -> str:
    """SHA-256 of token ids (and the attention mask) on any device: the key of resumable runs."""
    import hashlib

    digest = hashlib.sha256(tokens.detach().cpu().numpy().tobytes())
    if mask is not None:
        digest.update(mask.detach().cpu().numpy().tobytes())
    return digest.hexdigest()
