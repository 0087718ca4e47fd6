"""The suite checks the package's annotations at runtime (the root conftest's import hook): every
module outside the engine is covered, so a wrong shape fails a test."""

from __future__ import annotations

import importlib
from pathlib import Path

import jaxtyping
import pytest
import torch

PACKAGE = Path(__file__).resolve().parents[2] / "tl_geometry"


def _checked() -> list[str]:
    return importlib.import_module("conftest").CHECKED


def test_every_module_outside_the_engine_is_checked():
    modules = {".".join(("tl_geometry", *path.relative_to(PACKAGE).with_suffix("").parts))
               for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts}
    covered = {m for m in modules if any(m == c or m.startswith(c + ".") for c in _checked())}
    expected = {m for m in modules if not m.startswith("tl_geometry._engine") and m != "tl_geometry.__init__"}
    assert covered == expected


def test_a_wrong_shape_fails_in_a_folder_module():
    from tl_geometry.measure.votes import votes_from_winners

    winners, qpos = torch.zeros(2, 3, 4, dtype=torch.long), torch.zeros(5, 4, dtype=torch.long)  # batch 2 vs 5
    with pytest.raises(jaxtyping.TypeCheckError):
        votes_from_winners(winners, qpos)
