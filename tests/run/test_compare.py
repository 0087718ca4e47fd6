"""Comparing two analyses: agreement and κ against a direct count, transitions, per-head
differences, the model-level fallback, the CLI and its page."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch

import tl_geometry as tlg
from tl_geometry.cli.parser import main
from tl_geometry.errors import TLGeometryError
from tl_geometry.label.taxonomy import REGIMES, HeadTaxonomy
from tl_geometry.run.results import Analysis
from tl_geometry.run.run_folder import RunFolder

from ..tiny import random_tokens, tiny_model


@pytest.fixture(scope="module")
def pair():
    model = tiny_model(4, 2)
    run = lambda seed, n: tlg.analyze(model, random_tokens(3, 12, seed=seed), n, repeats=1, progress=False,  # noqa: E731
                                      bootstrap=10)
    return run(1, (1, 2, 4)), run(2, (2, 4, 8))


def with_labels(analysis: Analysis, labels: list[int]) -> Analysis:
    """The analysis with hand-set labels (votes 5 for the chosen regime, 1 for the others)."""
    votes = torch.ones(*analysis.taxonomy.shape, 3, dtype=torch.long)
    votes.view(-1, 3)[torch.arange(len(labels)), torch.tensor(labels)] = 5
    return Analysis(analysis.geometry, HeadTaxonomy.from_votes(votes, settings=analysis.taxonomy.settings))


def test_agreement_kappa_and_transitions_against_a_direct_count(pair):
    a_labels = [0, 1, 1, 2, 2, 2, 1, 1, 0, 2, 2, 1]
    b_labels = [0, 1, 2, 2, 2, 1, 1, 1, 1, 2, 0, 1]
    a, b = with_labels(pair[0], a_labels), with_labels(pair[1], b_labels)
    c = tlg.compare(a, b, names=("code", "news"))
    pairs = list(zip(a_labels, b_labels, strict=True))
    observed = sum(x == y for x, y in pairs) / 12
    expected = sum(a_labels.count(k) * b_labels.count(k) for k in range(3)) / 144
    assert c.head_by_head and c.agreement == pytest.approx(observed)
    assert c.kappa == pytest.approx((observed - expected) / (1 - expected))
    for i in range(3):
        for j in range(3):
            assert int(c.transitions[i, j]) == pairs.count((i, j))
    table = c.transition_table(shares=True)
    assert table.loc["code: mixer", "news: reset"] == pytest.approx(1 / 5)
    assert c.summary_lines()[0] == (f"code vs news: label agreement {observed:.3f}, Cohen's kappa {c.kappa:.3f} "
                                    f"(4 of 12 heads changed regime)")
    frame = c.to_dataframe()
    assert frame["changed"].sum() == 4 and list(frame["regime_code"][:3]) == ["retriever", "mixer", "mixer"]
    assert c.changed_heads(4)["changed"].all()


def test_per_head_differences_cover_the_shared_n(pair):
    a, b = pair
    c = tlg.compare(a, b)
    assert c.n == (2, 4)
    expected = b.geometry.mean("gap")[..., :2] - a.geometry.mean("gap")[..., 1:]
    torch.testing.assert_close(c.deltas["gap"], expected, equal_nan=True)
    torch.testing.assert_close(c.deltas["share_sink"], b.taxonomy.shares[..., 1] - a.taxonomy.shares[..., 1],
                               equal_nan=True)
    assert set(c.fractions().index) == set(REGIMES) and list(c.fractions().columns) == ["a", "b"]


def test_different_architectures_compare_at_the_model_level_only(pair):
    other = tlg.analyze(tiny_model(2, 1, n_layers=2), random_tokens(2, 10), (1, 2), repeats=1, progress=False,
                        bootstrap=10)
    c = tlg.compare(pair[0], other)
    assert not c.head_by_head and c.kappa is None and "model level only" in c.note
    assert c.summary_lines() == [c.note] and len(c.curves()) == 3 + 2
    with pytest.raises(TLGeometryError, match="same grid of heads"):
        c.to_dataframe()
    with pytest.raises(TLGeometryError, match="different names"):
        tlg.compare(pair[0], pair[1], names=("x", "x"))


def test_cli_compare_prints_kappa_and_writes_a_page_and_a_table(pair, tmp_path, capsys):
    for name, analysis in zip(("f32", "bf16"), pair, strict=True):
        folder = RunFolder(tmp_path / name)
        folder.create()
        folder.write_analysis(analysis, {}, {})
    out = tmp_path / "cmp"
    assert main(["compare", str(tmp_path / "f32"), str(tmp_path / "bf16"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    c = tlg.compare(*pair)
    assert printed[0].startswith(f"f32 vs bf16: label agreement {c.agreement:.3f}, Cohen's kappa {c.kappa:.3f}")
    assert printed[-1] == str((out / "compare.html").resolve())
    assert (out / "compare.csv").read_text().startswith("layer,head,name,regime_f32,regime_bf16,changed")
    before = (out / "compare.html").read_bytes()
    assert main(["compare", str(tmp_path / "f32"), str(tmp_path / "bf16"), "--out", str(out)]) == 2
    assert "already holds a comparison" in capsys.readouterr().err and (out / "compare.html").read_bytes() == before
    assert main(["compare", str(tmp_path / "f32"), str(tmp_path / "nothing")]) == 2
    if shutil.which("chromium"):
        dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=8000",
                              "--enable-logging=stderr", "--v=0", "--dump-dom", (out / "compare.html").as_uri()],
                             capture_output=True, text=True, timeout=120)
        assert len(re.findall("js-plotly-plot", dom.stdout)) >= 7  # every figure rendered
        errors = [line for line in dom.stderr.splitlines() if "CONSOLE" in line and "Uncaught" in line]
        assert not errors, errors


def test_runs_with_no_n_in_common_compare_by_label(tmp_path):
    model = tiny_model(4, 2)
    a = tlg.analyze(model, random_tokens(3, 12, seed=1), (1, 2), repeats=1, progress=False, bootstrap=10)
    b = tlg.analyze(model, random_tokens(3, 12, seed=2), (4, 8), repeats=1, progress=False, bootstrap=10)
    comparison = tlg.compare(a, b, names=("a", "b"))
    assert comparison.n == () and len(comparison.changed_heads(top=5)) == 5
    for name, analysis in (("A", a), ("B", b)):
        RunFolder(tmp_path / name).write_analysis(analysis, {}, {})
    out = tmp_path / "cmp"
    assert main(["compare", str(tmp_path / "A"), str(tmp_path / "B"), "--out", str(out)]) == 0
    assert (out / "compare.csv").is_file() and (out / "compare.html").is_file()


def test_runs_with_the_same_folder_name_get_a_flat_default_output(tmp_path, monkeypatch, pair):
    for parent, analysis in (("p1", pair[0]), ("p2", pair[1])):
        RunFolder(tmp_path / parent / "run").write_analysis(analysis, {}, {})
    monkeypatch.chdir(tmp_path)
    assert main(["compare", str(tmp_path / "p1" / "run"), str(tmp_path / "p2" / "run")]) == 0
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["compare-p1-run-vs-p2-run"]


def test_an_interrupted_comparison_does_not_block_its_rerun(tmp_path, pair):
    for name, analysis in (("A", pair[0]), ("B", pair[1])):
        RunFolder(tmp_path / name).write_analysis(analysis, {}, {})
    out = tmp_path / "cmp"
    out.mkdir()
    (out / ".tl-geometry").write_text("{}")
    (out / "compare.csv").write_text("half")  # stopped between its two outputs
    assert main(["compare", str(tmp_path / "A"), str(tmp_path / "B"), "--out", str(out)]) == 0
    assert (out / "compare.html").is_file() and (out / "compare.csv").read_text() != "half"
    # a complete comparison is replaced only on request
    assert main(["compare", str(tmp_path / "A"), str(tmp_path / "B"), "--out", str(out)]) == 2


def test_the_settings_that_differ_are_named(pair, tmp_path, capsys):
    first, second = pair
    longer = tlg.analyze(tiny_model(4, 2), random_tokens(3, 16, seed=1), (1, 2, 4), repeats=1, progress=False,
                         bootstrap=10)
    assert tlg.compare(first, first, names=("x", "y")).note.endswith("Same settings.")
    differ = tlg.compare(first, longer).note
    assert "Settings that differ: seq_len 12 vs 16." in differ and "dtype" not in differ
    half = tlg.analyze(tiny_model(4, 2).to(torch.float16), random_tokens(3, 12, seed=1), (1, 2, 4), repeats=1,
                       progress=False, bootstrap=10)
    assert "dtype float32 vs float16" in tlg.compare(first, half).note
    first.save(tmp_path / "a")
    longer.save(tmp_path / "b")
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "c")]) == 0
    assert "seq_len 12 vs 16" in capsys.readouterr().out
