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
    assert "cannot be written" in capsys.readouterr().err and not (blocker / "run").exists()


@pytest.mark.slow
def test_analyze_writes_results(capsys, smollm2, tmp_path):
    import pandas as pd

    out = tmp_path / "run"
    code = main(["analyze", "--windows", "2", "--seq-len", "32", "--n", "1,4", "--repeats", "2",
                 "--out", str(out), "--quiet"])
    assert code == 0 and capsys.readouterr().out.strip() == str((out / "report.html").resolve())
    heads = pd.read_csv(out / "heads.csv")
    assert len(heads) == 30 * 9 and {"f_top@1", "f_random@4", "gap@4"} <= set(heads.columns)
    assert (heads["f_top@1"] == 1).all() and heads["name"].iloc[10] == "L1H1"
    assert (out / "geometry.safetensors").is_file() and (out / "summary.csv").is_file()
    assert {"regime", "share_sink", "dominant_offset", "norm_ratio", "precision_bound@4"} <= set(heads.columns)
    assert set(heads["regime"]) <= {"retriever", "mixer", "reset"}
    from tl_geometry import Analysis

    assert Analysis.load(out).taxonomy.labels.shape == (30, 9)


@pytest.mark.slow
def test_interrupted_analyze_resumes_to_identical_results(capsys, smollm2, tmp_path, monkeypatch):
    import pandas as pd

    import tl_geometry.analysis as analysis_module

    args = ["analyze", "--windows", "4", "--seq-len", "24", "--n", "1,2", "--repeats", "2", "--batch-size", "1", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0
    real_stream, calls = analysis_module.stream_layers, {"n": 0}

    def interrupted(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_stream(*a, **k)

    monkeypatch.setattr(analysis_module, "stream_layers", interrupted)
    assert main([*args, "--out", str(tmp_path / "cut")]) == 130
    assert "--resume" in capsys.readouterr().err and (tmp_path / "cut" / "checkpoint.safetensors").is_file()
    monkeypatch.setattr(analysis_module, "stream_layers", real_stream)
    assert main([*args, "--out", str(tmp_path / "cut"), "--resume"]) == 0
    assert not (tmp_path / "cut" / "checkpoint.safetensors").exists()
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "cut" / "heads.csv"), pd.read_csv(tmp_path / "whole" / "heads.csv"))


@pytest.mark.slow
def test_prune_and_report_fill_the_same_run(capsys, smollm2, tmp_path):
    import pandas as pd

    out = tmp_path / "run"
    assert main(["analyze", "--windows", "2", "--seq-len", "24", "--n", "1,2", "--repeats", "2", "--out", str(out),
                 "--quiet"]) == 0
    assert main(["prune", str(out), "--windows", "2", "--seq-len", "24", "--scan-windows", "1", "--scan-seq-len", "8",
                 "--quiet"]) == 0
    curve = pd.read_csv(out / "pruning.csv")
    assert set(curve["method"]) == {"magnitude", "entropy", "gradient", "random", "taxonomy"}
    assert (curve[curve.retention == 1.0]["delta_nll"] == 0).all()
    assert len(pd.read_csv(out / "single_head_scan.csv")) == 30 * 9 and (out / "topn.csv").is_file()
    (out / "report.html").unlink()
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    page = (out / "report.html").read_text()
    assert capsys.readouterr().out.strip() == str((out / "report.html").resolve())
    assert "Pruning curves" in page and "Single-head removal" in page and "Inside one head" in page
    assert main(["report", str(tmp_path / "nothing")]) == 2
