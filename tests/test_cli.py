"""The tl-geometry command line: one-line errors with exit code 2, and the smoke run."""

from __future__ import annotations

import pytest

from tl_geometry.cli import main


def test_unknown_model_is_one_line_error(capsys):
    assert main(["analyze", "--model", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown model 'no-such-model'" in err and "smollm2-135m" in err


def test_bad_n_and_unwritable_output_are_one_line_errors(capsys, tmp_path):
    assert main(["analyze", "--n", "0,2"]) == 2
    assert "--n values must be integers ≥ 1" in capsys.readouterr().err
    assert main(["analyze", "--n", "300", "--seq-len", "256"]) == 2
    assert "out of range" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["analyze", "--out", str(blocker / "run")]) == 2
    assert "not writable" in capsys.readouterr().err


@pytest.mark.slow
def test_analyze_writes_results(capsys, smollm2, tmp_path):
    import pandas as pd

    out = tmp_path / "run"
    code = main(["analyze", "--windows", "2", "--seq-len", "32", "--n", "1,4", "--repeats", "2",
                 "--out", str(out), "--quiet"])
    assert code == 0 and capsys.readouterr().out.strip() == str(out.resolve())
    heads = pd.read_csv(out / "heads.csv")
    assert len(heads) == 30 * 9 and {"f_top@1", "f_random@4", "gap@4"} <= set(heads.columns)
    assert (heads["f_top@1"] == 1).all() and heads["name"].iloc[10] == "L1H1"
    assert (out / "geometry.safetensors").is_file() and (out / "summary.csv").is_file()
    assert {"regime", "share_sink", "dominant_offset", "norm_ratio", "precision_bound@4"} <= set(heads.columns)
    assert set(heads["regime"]) <= {"retriever", "mixer", "reset"}
    from tl_geometry import Analysis

    assert Analysis.load(out).taxonomy.labels.shape == (30, 9)
