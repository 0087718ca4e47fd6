"""One resumable checkpoint for every long job (the analysis, the single-head scan, the streaming
curves): the job's state in one safetensors file (tensors, plus JSON state in its metadata) with
the key of the settings it was computed under, written atomically (``io.atomic_path``: the old
state or the new one, never half of one, never a ``.tmp`` left behind).

Everything that could stop a resume is checked when the checkpoint is opened, before the job's
first step: a folder where the file should be, a folder that does not exist or cannot be
written, a damaged file, a file of another job or of other settings."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torch import Tensor

from ..errors import TLGeometryError
from ..io import load_tensors, save_tensors

__all__ = ["KeyedCheckpoint"]

_KIND = "Checkpoint"


class KeyedCheckpoint:
    """The state of ``job`` at ``path`` under the settings ``key`` (a JSON-able dict: what must
    match for the saved state to be resumed, e.g. the model, the tokens' digest, the options)."""

    def __init__(self, path: str | Path, key: dict[str, Any], job: str):
        self.path, self.job = Path(path), job
        self.key = json.dumps(key, sort_keys=True)
        if self.path.is_dir():
            raise TLGeometryError(f"checkpoint {str(self.path)!r} is a folder: pass a file path, e.g. "
                                  f"{str(self.path / 'checkpoint.safetensors')!r}.")
        if not self.path.parent.is_dir() or not os.access(self.path.parent, os.W_OK | os.X_OK):
            raise TLGeometryError(f"checkpoint {str(self.path)!r} cannot be written: its folder "
                                  f"{str(self.path.parent)!r} does not exist or is not writable.")

    def _read(self) -> tuple[dict[str, Tensor], dict[str, Any], str | None]:
        """Tensors, state and why they cannot be resumed (None: they can)."""
        try:
            tensors, meta = load_tensors(self.path, _KIND)
        except TLGeometryError:
            return {}, {}, "it is damaged, truncated or not a checkpoint"
        if meta.get("job", "analysis") != self.job:
            return {}, {}, f"it holds the state of another job ({meta.get('job', 'analysis')})"
        if meta.get("key") != self.key:
            return {}, {}, f"it was written by {'an' if self.job[0] in 'aeiou' else 'a'} {self.job} with other settings"
        state = meta.get("state", {})
        return tensors, state if isinstance(state, dict) else {}, None

    def problem(self) -> str | None:
        """Why the saved state cannot be resumed, or None (no file, or one that resumes)."""
        return self._read()[2] if self.path.is_file() else None

    def load(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """The saved tensors and state (both empty without a file); a file that cannot be resumed
        is one :class:`TLGeometryError` that names it and why."""
        if not self.path.is_file():
            return {}, {}
        tensors, state, problem = self._read()
        if problem is not None:
            raise TLGeometryError(f"cannot resume from the checkpoint {str(self.path)!r}: {problem}; delete it to "
                                  "start again.")
        return tensors, state

    def save(self, tensors: dict[str, Tensor], state: dict[str, Any] | None = None) -> None:
        save_tensors(self.path, _KIND, tensors, key=self.key, job=self.job, state=state or {})

    def drop(self) -> None:
        self.path.unlink(missing_ok=True)
