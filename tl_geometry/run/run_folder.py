"""The layout of a run folder, owned in one place.

A run folder holds one analysis and what was derived from it::

    settings.json                 the run's configuration and provenance, with its run_id
    geometry.safetensors          per-window separability, sink and regime results
    taxonomy.safetensors          per-head votes
    heads.csv, summary.csv        tables of the analysis
    head_types.safetensors        TransformerLens's head-type scores of the model (tlg.head_types)
    drilldown_<regime>.json       head drill-down figures
    checkpoint.safetensors        an interrupted analysis (removed once it has finished)
    pruning.csv, single_head_scan.csv, topn.csv, scan_checkpoint.safetensors   from ``tl-geometry prune``
    streaming.csv, stream_checkpoint.safetensors                                from ``tl-geometry stream``
    derived.json                  the run_id each derived table was computed from
    report.html
    manifest.json                 every result file of the analysis with its size and SHA-256, written last
    .tl-geometry                  the marker: tl-geometry owns this folder (written first)
    .tl-geometry.lock             held (``filelock``) by the one process writing to the folder
    .tl-geometry.writer           who holds the lock: named to a second writer when it is refused

Every file is written atomically. A run writes only into a new or empty folder, a folder it
marked as its own, or a run folder written before markers existed; any other non-empty folder
is refused, ``overwrite`` included, and ``overwrite`` deletes only files tl-geometry wrote. One
process writes at a time (:meth:`RunFolder.writing`). An analysis is finished only once its
manifest is written, after every result; readers check the manifest, so a folder interrupted
while saving is never taken for a finished one. A finished analysis is replaced only on request
(``overwrite``), and then the tables derived from the old one go with it; the report reads a
derived table only when ``derived.json`` says it belongs to the analysis beside it, so it never
mixes the results of two analyses. ``Analysis.save`` writes through the same rules as
``tl-geometry analyze`` (``RunFolder(path, api=True)`` words the refusals for Python).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import TLGeometryError
from ..io import (
    MANIFEST,
    MARKER,
    atomic_path,
    check_sealed,
    is_plain_name,
    manifest_files,
    sha256_file,
    staged,
    tensor_file_kind,
)
from ..label.head_types import HEAD_TYPES_FILE
from ..label.taxonomy import REGIMES
from .derived_tables import DERIVED_TABLES, read_table

if TYPE_CHECKING:  # the analysis and the jobs sit above the folder: it takes their results as they come
    import pandas as pd

__all__ = ["RunFolder", "DERIVED_TABLES"]

LOCK, WRITER = ".tl-geometry.lock", ".tl-geometry.writer"
# Files of a finished analysis that the manifest vouches for (drill-downs are added by name).
RESULT_FILES = ("geometry.safetensors", "taxonomy.safetensors", "settings.json", "heads.csv", "summary.csv")
# Checkpoints of earlier versions (JSON), removed with the analysis they belonged to.
_OLD_CHECKPOINTS = ("scan_checkpoint.json", "stream_checkpoint.json")


class _File:
    """A file of the run folder by name: ``run.geometry`` is ``run.path / "geometry.safetensors"``."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, run: RunFolder | None, owner: type | None = None) -> Path:
        return self if run is None else run.path / self.name  # type: ignore[return-value]


@dataclass(frozen=True)
class RunFolder:
    """One run folder (see the module docstring for its files). ``api``: refusals name the Python
    arguments (``overwrite=True``) rather than the command line's flags (``--overwrite``)."""

    path: Path
    api: bool = False

    def __init__(self, path: str | Path, *, api: bool = False):
        object.__setattr__(self, "path", Path(path).expanduser())  # "~/x" is the home folder's, as pandas reads it
        object.__setattr__(self, "api", api)

    @property
    def _overwrite(self) -> str:
        return "overwrite=True" if self.api else "--overwrite"

    @property
    def _elsewhere(self) -> str:
        return "save to another folder" if self.api else "choose another --out"

    # ----- names --------------------------------------------------------------------------------
    geometry = _File("geometry.safetensors")
    taxonomy = _File("taxonomy.safetensors")
    settings = _File("settings.json")
    checkpoint = _File("checkpoint.safetensors")
    scan_checkpoint = _File("scan_checkpoint.safetensors")
    stream_checkpoint = _File("stream_checkpoint.safetensors")
    report = _File("report.html")
    derived_manifest = _File("derived.json")
    manifest = _File(MANIFEST)
    marker = _File(MARKER)

    def drilldown(self, regime: str) -> Path:
        return self.path / f"drilldown_{regime}.json"

    @property
    def is_owned(self) -> bool:
        """Whether tl-geometry marked this folder as its own."""
        return self.marker.is_file()

    @property
    def _has_results(self) -> bool:
        return self.geometry.is_file() or self.taxonomy.is_file()

    @property
    def is_legacy(self) -> bool:
        """A finished run folder written before markers and manifests (it still loads): unmarked, and
        its two result files are tl-geometry's by content (the kind their headers record), not only
        by name, so a folder of someone else's files of those names is not taken for one."""
        return (not self.is_owned and tensor_file_kind(self.geometry) == "GeometryResult"
                and tensor_file_kind(self.taxonomy) == "HeadTaxonomy")

    @property
    def is_finished(self) -> bool:
        """Whether the folder holds a finished analysis: its manifest is there (a legacy folder:
        both result files). :meth:`verify` checks the files against it."""
        return self.is_legacy or bool(self._manifest_files())

    @property
    def is_interrupted(self) -> bool:
        """Results were being written when the run stopped: some are there, the manifest is not."""
        return self.is_owned and self._has_results and not self.is_finished

    def _manifest_files(self) -> dict[str, dict[str, Any]]:
        return manifest_files(self.path)

    def verify(self) -> None:
        """Raise a :class:`TLGeometryError` unless the folder holds a finished analysis whose files
        match their manifest (sizes and SHA-256); legacy folders pass (``io.check_sealed``)."""
        if not (self.is_owned or self.is_legacy):
            if self._has_results:  # files of those names, but not tl-geometry's results
                raise TLGeometryError(f"cannot read {str(self.path)!r} as a run folder: its geometry/taxonomy files are "
                                      "not tl-geometry results (damaged, or someone else's files of those names)")
            raise TLGeometryError(f"{str(self.path)!r} is not a finished run folder (no geometry/taxonomy results): "
                                  "run tl-geometry analyze first")
        check_sealed(self.path)

    def check_not_foreign(self, ours: tuple[str, ...] = ()) -> None:
        """Refuse an existing non-empty folder that is neither marked as tl-geometry's nor a legacy
        run folder (``ours``: names that a folder of the caller's kind may hold before its marker,
        e.g. the outputs of an earlier comparison)."""
        if not self.path.is_dir() or self.is_owned or self.is_legacy:
            return
        foreign = sorted(p.name for p in self.path.iterdir() if p.name not in ours)
        if foreign:
            shown = ", ".join(foreign[:3]) + (", …" if len(foreign) > 3 else "")
            raise TLGeometryError(f"{str(self.path)!r} is not empty and was not written by tl-geometry ({shown}): "
                                  f"{self._elsewhere} (a new or empty folder); {self._overwrite} never replaces "
                                  "files tl-geometry did not write")

    # ----- one writer ---------------------------------------------------------------------------
    @contextmanager
    def writing(self, *, elsewhere: bool = False) -> Iterator[None]:
        """Hold the folder's lock while writing (creates the folder, and its marker unless it is a
        run folder from before markers): a second process is refused with one line naming the
        first (``elsewhere``: the refusal also offers another output folder, where the caller
        has one). ``filelock`` holds an OS lock where the platform has one (``flock``,
        ``msvcrt``), so a process that dies releases it with its file descriptors."""
        from filelock import FileLock, Timeout

        self.create()
        lock = FileLock(self.path / LOCK)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            try:
                holder = (self.path / WRITER).read_text(encoding="utf-8").strip()
            except OSError:
                holder = ""
            advice = f"wait for it to finish, or {self._elsewhere}" if elsewhere else "wait for it to finish"
            raise TLGeometryError(f"{str(self.path)!r} is being written by {holder or 'another process'}: "
                                  f"{advice}") from None
        except OSError as exc:  # after Timeout (one too): a lock file that is a folder, immutable, a dead link
            raise TLGeometryError(f"cannot lock {str(self.path / LOCK)!r} ({exc.strerror or exc}): remove or repair "
                                  f"it, or {self._elsewhere}") from None
        try:
            self._write_text(self.path / WRITER, f"tl-geometry pid {os.getpid()} on {socket.gethostname()} since "
                                                 f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            yield
        finally:
            lock.release()

    # ----- before an analysis -------------------------------------------------------------------
    def check_new_analysis(self, *, overwrite: bool, resume: bool) -> None:
        """Refuse to replace a finished analysis without ``overwrite``, or to resume one that has
        no checkpoint; refuse a folder that is not tl-geometry's; check that the folder can be
        written. Changes nothing on disk."""
        self._check_name()
        if self.path.exists() and not self.path.is_dir():
            raise TLGeometryError(f"output folder {str(self.path)!r} is a file, not a folder: {self._elsewhere}")
        self.check_writable()
        self.check_not_foreign()
        if self.is_interrupted and not (resume or overwrite):
            again = f"pass {self._overwrite} to replace it" if self.api else \
                "rerun the same command with --resume (or --overwrite to start again)"
            raise TLGeometryError(f"{str(self.path)!r} was interrupted while saving its results: {again}")
        if resume and self.is_finished:  # a checkpoint beside it is a leftover: resuming would replace the analysis
            raise TLGeometryError(f"{self.path} holds a finished analysis: nothing to resume (pass --overwrite instead "
                                  "of --resume to replace it, or tl-geometry report to write its report)")
        if self.is_finished and not overwrite and not resume:
            raise TLGeometryError(f"{self.path} already holds a finished analysis: pass {self._overwrite} to replace "
                                  f"it (and the pruning/scan results derived from it), or {self._elsewhere}")

    def check_writable(self) -> None:
        """The folder, or the nearest existing folder above it, must be a writable folder (and its
        name one the file system takes)."""
        self._check_name()
        if self.path.is_symlink() and not self.path.exists():
            raise TLGeometryError(f"output folder {str(self.path)!r} is a symbolic link to nothing "
                                  f"({os.readlink(self.path)!r} does not exist): {self._elsewhere}, or create its target")
        existing = self.path
        while not existing.exists() and existing.parent != existing:
            existing = existing.parent
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            what = "is not a folder" if not existing.is_dir() else "is not writable"
            raise TLGeometryError(f"output folder {str(self.path)!r} cannot be written: {str(existing)!r} {what}; "
                                  f"{self._elsewhere}")

    def _check_name(self) -> None:
        """A name the file system takes (checked first: asking about a longer one raises)."""
        too_long = [part for part in self.path.parts if len(part.encode()) > 255]
        if too_long:
            raise TLGeometryError(f"output folder {str(self.path)[:60]!r}… has a name of {len(too_long[0].encode())} "
                                  f"bytes; file systems take at most 255: {self._elsewhere}")

    def create(self) -> None:
        """Create the folder and its marker (once the run's inputs are valid: failed runs leave no
        empty folder). A finished run folder from before markers stays unmarked: marked without
        a manifest, it would read as an interrupted run."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            if not self.marker.is_file() and not self.is_legacy:
                self._mark()
        except OSError as exc:
            raise TLGeometryError(f"cannot create output folder {str(self.path)!r} ({exc.strerror}): check the "
                                  f"path and its permissions, or {self._elsewhere}") from None

    def drop_stale_checkpoint(self, rank: int = 0, world_size: int = 1) -> bool:
        """Remove this process's checkpoint of an earlier interrupted run (call once the new run's
        inputs are validated; under torchrun each rank its own); True if there was one."""
        from .distributed import shard_path

        path = shard_path(self.checkpoint, rank, world_size)
        if not path.is_file():
            return False
        path.unlink()
        return True

    # ----- the analysis -------------------------------------------------------------------------
    def write_analysis(self, analysis: Any, settings: dict[str, Any], drilldowns: dict[str, str]) -> str:
        """Write a finished :class:`~tl_geometry.Analysis` with its tables and drill-down figures (JSON by regime) and
        return its new run_id. The new files are written under temporary names first, so a failure
        there (a full disk) leaves the old analysis whole and loadable; then the manifest goes, they
        are swapped in and the manifest comes back last, so a run stopped while swapping is never
        taken for a finished one. Files tl-geometry wrote for a previous analysis here (its
        manifest's, the derived tables, its report) are removed; nothing else is."""
        legacy = self.is_legacy
        self.create()
        run_id = uuid.uuid4().hex
        geometry, taxonomy = (replace(result, settings={**result.settings, "run_id": run_id})
                              for result in (analysis.geometry, analysis.taxonomy))
        previous = set(self._manifest_files()) | ({self.drilldown(r).name for r in REGIMES} if legacy else set())
        derived = set(self._manifest() or {}) | (set(DERIVED_TABLES) if legacy else set())
        with staged(self.path) as stage:  # the new files under temporary names: the old analysis stays whole until commit
            geometry.save(stage.path(self.geometry.name))
            taxonomy.save(stage.path(self.taxonomy.name))
            self._write_text(stage.path(self.settings.name), json.dumps({**settings, "run_id": run_id}, indent=1))
            self._write_frame(stage.path("heads.csv"), analysis.heads_table(all_columns=True))
            self._write_frame(stage.path("summary.csv"), analysis.geometry.summary())
            if analysis.head_types is not None:
                analysis.head_types.save(stage.path(HEAD_TYPES_FILE))
            for regime, figure in drilldowns.items():
                self._write_text(stage.path(self.drilldown(regime).name), figure)
            written = list(stage.names)
            files = {name: {"bytes": stage.file(name).stat().st_size, "sha256": sha256_file(stage.file(name))}
                     for name in written}
            if legacy:  # its new analysis makes the folder tl-geometry's
                self._mark()
            self.manifest.unlink(missing_ok=True)
            self.derived_manifest.unlink(missing_ok=True)
            stage.commit()
        for stale in [*(previous - set(written)), *(derived & set(DERIVED_TABLES)), self.report.name, self.scan_checkpoint.name,
                      self.stream_checkpoint.name, *_OLD_CHECKPOINTS]:
            self._remove(stale)
        self._remove(self.checkpoint.name)  # finished: nothing is left to resume, whatever stops the run next
        self._write_text(self.manifest, json.dumps({"run_id": run_id, "files": files}, indent=1))
        return run_id

    def read_settings(self) -> dict[str, Any]:
        try:
            settings = json.loads(self.settings.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TLGeometryError(f"cannot read {self.settings} ({exc}): rerun tl-geometry analyze") from None
        if not isinstance(settings, dict):
            raise TLGeometryError(f"{self.settings} is not a JSON object: rerun tl-geometry analyze")
        return settings

    def run_id(self) -> str | None:
        """The run_id of the finished analysis (None for folders written before run ids)."""
        from .geometry import GeometryResult

        self.verify()
        return GeometryResult.load(self.geometry).settings.get("run_id")

    # ----- derived tables -----------------------------------------------------------------------
    def write_derived(self, name: str, frame: pd.DataFrame, run_id: str | None) -> Path:
        """Write a derived table and record that it belongs to the analysis ``run_id``."""
        if name not in DERIVED_TABLES:
            raise ValueError(f"unknown derived table {name!r}")
        path = self._write_frame(self.path / name, frame)
        manifest = self._manifest() or {}
        manifest[name] = run_id
        self._write_text(self.derived_manifest, json.dumps(manifest, indent=1))
        return path

    def forget_derived(self, names: tuple[str, ...]) -> None:
        """Credit none of ``names`` to the analysis until each is written again: a job that rewrites
        several tables starts so, and an interrupted one never leaves two runs' tables credited as one."""
        manifest = self._manifest()
        if manifest is not None and set(names) & set(manifest):
            self._write_text(self.derived_manifest, json.dumps({k: v for k, v in manifest.items() if k not in names}, indent=1))

    def read_derived(self, run_id: str | None, heads: tuple[int, int] | None = None
                     ) -> tuple[dict[str, pd.DataFrame], dict[str, str]]:
        """The derived tables that belong to the analysis ``run_id`` (by name), each checked row by
        row and whole (:func:`~tl_geometry.run.derived_tables.read_table`; ``heads`` the analysis's
        ``(n_layers, n_heads)``), and those present but left out, with
        why (another analysis's, or ``derived.json`` unreadable)."""
        manifest = self._manifest()
        tables, left_out = {}, {}
        for name, table in DERIVED_TABLES.items():
            path = self.path / name
            if not path.is_file():
                continue
            if manifest is None:
                left_out[name] = (f"{self.derived_manifest.name}, which says which analysis it belongs to, is "
                                  f"unreadable; rerun {table.command}")
                continue
            # Folders written before run ids have no manifest: their tables are the analysis's own.
            if manifest.get(name, run_id if run_id is None else "") != run_id:
                left_out[name] = f"computed from an earlier analysis; rerun {table.command}"
                continue
            tables[name] = read_table(path, heads)
        return tables, left_out

    # ----- helpers ------------------------------------------------------------------------------
    def _manifest(self) -> dict[str, Any] | None:
        """``derived.json`` ({} when absent, None when unreadable: then no derived table is trusted)."""
        if not self.derived_manifest.is_file():
            return {}
        try:
            manifest = json.loads(self.derived_manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return manifest if isinstance(manifest, dict) else None

    def _remove(self, name: str) -> None:
        """Remove the folder's own file ``name`` (a plain name: nothing outside the folder, ever)."""
        if not is_plain_name(name):
            raise TLGeometryError(f"refusing to remove {name!r} from {str(self.path)!r}: not a file name of that folder")
        (self.path / name).unlink(missing_ok=True)

    def _mark(self) -> None:
        self._write_text(self.marker, json.dumps({"tool": "tl-geometry", "layout": 1}))

    def _write_text(self, path: Path, text: str) -> Path:
        with atomic_path(path) as tmp:
            tmp.write_text(text, encoding="utf-8")
        return path

    def _write_frame(self, path: Path, frame: pd.DataFrame) -> Path:
        with atomic_path(path) as tmp:
            frame.to_csv(tmp, index=False)
        return path
