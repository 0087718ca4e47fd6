"""Documentation that runs: every Python block of the README and of docs/*.md executes."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [(path, i, code) for path in DOCS
          for i, code in enumerate(re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S))]


@pytest.mark.slow
@pytest.mark.parametrize("path,index,code", BLOCKS, ids=[f"{p.name}-{i}" for p, i, _ in BLOCKS])
def test_python_blocks_execute(path, index, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # what a block saves lands in a temporary folder
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the documented way is the way without warnings
        exec(compile(code, f"{path.name}[{index}]", "exec"), {"__name__": "__docs__"})


def test_every_public_name_is_in_the_api_reference():
    import tl_geometry

    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    public = [*tl_geometry.__all__, *(f"{folder}.{name}" for folder in ("capture", "intervene")
                                      for name in getattr(tl_geometry, folder).__all__)]
    missing = [name for name in public if f"### `{name}`" not in api]
    assert not missing, f"document these in docs/api.md: {missing}"
    listed = re.findall(r"^### `([A-Za-z_.]+)`", api, re.M)
    assert sorted(listed) == sorted(public), "docs/api.md lists names that are not public"


def test_the_api_reference_is_current_and_cuts_no_sentence():
    """Every entry's and bullet's summary is its docstring's whole first paragraph (the page equals
    what scripts/update_api_reference.py writes), and each ends a sentence."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("update_api_reference", ROOT / "scripts" / "update_api_reference.py")
    updater = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(updater)
    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert api == updater.refreshed(api), "docs/api.md is stale: run scripts/update_api_reference.py"
    summaries = [m["summary"] for m in updater.ENTRY.finditer(api)] + [m["summary"] for m in updater.BULLET.finditer(api)]
    assert len(summaries) > 40
    cut = [summary for summary in summaries if not summary.rstrip().endswith((".", ")", "!", "?"))]
    assert not cut, cut


def test_the_public_face_is_small_and_the_moved_names_still_work_with_a_warning():
    import tl_geometry as tlg

    assert len(tlg.__all__) <= 30
    for name, folder in tlg._MOVED.items():
        with pytest.warns(DeprecationWarning, match=f"tlg.{name} is now tlg.{folder}.{name}"):
            assert getattr(tlg, name) is getattr(getattr(tlg, folder), name)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name': its public names are dir.* tlg.intervene"):
        tlg.no_such_name  # noqa: B018


def test_local_links_and_paths_in_the_docs_exist():
    broken = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):  # markdown links without a scheme
            if not (path.parent / target).exists():
                broken.append(f"{path.name}: {target}")
    assert not broken, broken


def _tracked_text_files() -> list[Path]:
    import subprocess

    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    keep = (".py", ".md", ".ipynb", ".toml", ".sh", ".cfg", ".txt", "Makefile", "run")
    return [ROOT / name for name in names if name.endswith(keep) and (ROOT / name).is_file()]


def test_nothing_cites_a_file_outside_the_repository():
    outside = re.compile(r"\.\./shared|SPEC\.md|SPEC §|/work/|\.\./\.\./")
    found = [f"{path.relative_to(ROOT)}:{n}" for path in _tracked_text_files()
             for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
             if outside.search(line) and path.name != "test_docs.py"]
    assert not found, f"references to files outside the repository: {found}"
    for path in DOCS:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text(encoding="utf-8")):
            assert (path.parent / target).resolve().is_relative_to(ROOT), f"{path.name} links outside: {target}"


def test_every_cited_definition_anchor_exists():
    anchors = {name: set(re.findall(r'<a id="([a-z0-9-]+)"></a>', (ROOT / "docs" / name).read_text(encoding="utf-8")))
               for name in ("metrics.md", "theory.md")}
    cited = re.compile(r"(metrics|theory)\.md#([a-z0-9-]+)")
    missing = [f"{path.relative_to(ROOT)}: {doc}.md#{anchor}" for path in _tracked_text_files()
               for doc, anchor in cited.findall(path.read_text(encoding="utf-8", errors="replace"))
               if anchor not in anchors[f"{doc}.md"]]
    assert not missing, missing
    assert {"objects", "selection", "separability", "random-baseline", "queries", "sink", "regime", "taxonomy",
            "interventions", "windows", "claims"} <= anchors["metrics.md"]


def test_the_docs_count_the_demo_notebooks_there_are():
    notebooks = sorted((ROOT / "demos").glob("*.ipynb"))
    words = {4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    assert f"{words[len(notebooks)]} notebooks" in index
    listing = (ROOT / "demos" / "README.md").read_text(encoding="utf-8")
    assert all(f"`{path.name}`" in listing for path in notebooks)


def test_the_readme_opens_with_the_answer_in_a_few_plain_lines():
    """At most 12 lines of text before the picture of the report's first screen, the labels'
    meanings among them; the picture exists and the terminal output follows it."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    opening, _, rest = readme.partition("![")
    lines = [line for line in opening.splitlines()[1:] if line.strip()]
    assert len(lines) <= 12, lines
    assert all(f"**{regime}**: {meaning}" in opening for regime, meaning in
               (("retriever", "the current token wins"), ("mixer", "the sink (BOS) wins"), ("reset", "another token wins")))
    picture = re.match(r"[^\]]*\]\(([^)]+)\)", rest)[1]
    assert (ROOT / picture).is_file() and picture.endswith(".png")
    assert rest.index("```text") < rest.index("## Two commands")
