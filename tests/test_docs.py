"""Documentation that runs: every Python block of the README and of docs/*.md executes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [(path, i, code) for path in DOCS
          for i, code in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S))]


@pytest.mark.slow
@pytest.mark.parametrize("path,index,code", BLOCKS, ids=[f"{p.name}-{i}" for p, i, _ in BLOCKS])
def test_python_blocks_execute(path, index, code):
    exec(compile(code, f"{path.name}[{index}]", "exec"), {"__name__": "__docs__"})


def test_every_public_name_is_in_the_api_reference():
    import tl_geometry

    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    missing = [name for name in tl_geometry.__all__ if f"### `{name}`" not in api]
    assert not missing, f"document these in docs/api.md: {missing}"


def test_local_links_and_paths_in_the_docs_exist():
    broken = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):  # markdown links without a scheme
            if not (path.parent / target).exists():
                broken.append(f"{path.name}: {target}")
    assert not broken, broken
