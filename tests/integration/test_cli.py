"""The tl-geometry command line: one-line errors with exit code 2, and the smoke run."""

from __future__ import annotations

import json
import re
import warnings

import pytest

from tl_geometry.cli.parser import build_parser, main
from tl_geometry.errors import TLGeometryError

from ..run.test_run_folder import snapshot


def _garbage(folder):
    """A user's folder with files named like a finished analysis's, which are not tl-geometry's."""
    folder.mkdir()
    for name in ("geometry.safetensors", "taxonomy.safetensors", "heads.csv", "pruning.csv"):
        (folder / name).write_text(f"old {name}")


def _finished(folder):
    """A finished analysis as versions before markers wrote it (what the checks before the model
    look at), with a table beside it."""
    import tl_geometry as tlg

    from ..tiny import random_tokens, tiny_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a tiny run's labels rest on few votes: said elsewhere
        analysis = tlg.analyze(tiny_model(4, 2), random_tokens(2, 12, seed=1), (1, 2), repeats=1, bootstrap=10,
                               progress=False)
    folder.mkdir()
    analysis.geometry.save(folder / "geometry.safetensors")
    analysis.taxonomy.save(folder / "taxonomy.safetensors")
    (folder / "pruning.csv").write_text("old pruning.csv")


def _interrupted(folder):
    folder.mkdir()
    (folder / ".tl-geometry").write_text("{}")
    (folder / "checkpoint.safetensors").write_text("an earlier run's state")


def _foreign(folder):
    """A user's own folder that happens to hold files with tl-geometry's names."""
    folder.mkdir()
    (folder / "settings.json").write_text("mine")
    (folder / "drilldown_mine.json").write_text("{}")


def _saving_interrupted(folder):
    """A run stopped between its result files: the marker and one result, no manifest."""
    folder.mkdir()
    (folder / ".tl-geometry").write_text("{}")
    (folder / "geometry.safetensors").write_text("half of a run")


def _corpus(name, data: bytes):
    def make(folder):
        folder.mkdir()
        (folder / name).write_bytes(data)
    return make


# (arguments with {dir} for a scratch folder, how to prepare it, what the one line must say).
# Every case fails before the model loads and must leave the folder exactly as it was.
CASES = {
    "finished run, no --overwrite": (["analyze", "--out", "{dir}"], _finished, "already holds a finished analysis"),
    "finished run, --resume, no checkpoint": (["analyze", "--out", "{dir}", "--resume"], _finished, "nothing to resume"),
    "checkpoint kept on a corpus typo": (["analyze", "--out", "{dir}", "--corpus", "python-refrence"], _interrupted,
                                         "unknown corpus 'python-refrence'"),
    "seq-len 0": (["analyze", "--out", "{dir}/run", "--seq-len", "0"], None, "--seq-len must be ≥ 2"),
    "seq-len 1": (["analyze", "--out", "{dir}/run", "--seq-len", "1", "--n", "1"], None, "--seq-len must be ≥ 2"),
    "windows 0": (["analyze", "--out", "{dir}/run", "--windows", "0"], None, "--windows must be ≥ 1"),
    "batch-size 0": (["analyze", "--out", "{dir}/run", "--batch-size", "0"], None, "--batch-size must be ≥ 1"),
    "threads 0": (["analyze", "--out", "{dir}/run", "--threads", "0"], None, "--threads must be at least 1"),
    "repeats -1": (["analyze", "--out", "{dir}/run", "--repeats", "-1"], None, "repeats must be 'auto' or an int ≥ 0"),
    "jsonl array line": (["analyze", "--out", "{dir}/run", "--corpus", "{dir}/c.jsonl"],
                         _corpus("c.jsonl", b'{"text": "fine"}\n[1, 2]\n'), "c.jsonl:2: each line must be a JSON object"),
    "jsonl number line": (["analyze", "--out", "{dir}/run", "--corpus", "{dir}/c.jsonl"],
                          _corpus("c.jsonl", b"3\n"), "(got int)"),
    "jsonl null text": (["analyze", "--out", "{dir}/run", "--corpus", "{dir}/c.jsonl"],
                        _corpus("c.jsonl", b'{"text": null}\n'), "text=None"),
    "non-UTF-8 text": (["analyze", "--out", "{dir}/run", "--corpus", "{dir}/c.txt"],
                       _corpus("c.txt", "caf\u00e9".encode("latin-1")), "c.txt' is not UTF-8"),
    "report of an empty folder": (["report", "{dir}"], lambda folder: folder.mkdir(), "not a finished run folder"),
    "report of a garbage result": (["report", "{dir}"], _garbage, "cannot read"),
    "prune of a garbage result": (["prune", "{dir}"], _garbage, "cannot read"),
    "a user's files named like results": (["analyze", "--out", "{dir}", "--overwrite"], _garbage,
                                          "was not written by tl-geometry"),
    "prune with --windows 0": (["prune", "{dir}", "--windows", "0"], _finished, "--windows must be ≥ 1"),
    "prune's scan beyond its windows": (["prune", "{dir}", "--windows", "2", "--seq-len", "16", "--scan-seq-len", "64"],
                                        _finished, "--scan-windows 4 × --scan-seq-len 64 asks for more"),
    "a foreign folder": (["analyze", "--out", "{dir}"], _foreign, "not empty and was not written by tl-geometry"),
    "a foreign folder, --overwrite": (["analyze", "--out", "{dir}", "--overwrite"], _foreign,
                                      "--overwrite never replaces files tl-geometry did not write"),
    "--out is a file": (["analyze", "--out", "{dir}/c.txt"], _corpus("c.txt", b"text"), "is a file, not a folder"),
    "interrupted while saving": (["analyze", "--out", "{dir}"], _saving_interrupted,
                                 "interrupted while saving its results: rerun the same command with --resume"),
    "report of a run interrupted while saving": (["report", "{dir}"], _saving_interrupted,
                                                 "interrupted while saving its results"),
    "compare a run with itself": (["compare", "{dir}", "{dir}"], _finished, "are the same run folder"),
    "--device typo": (["analyze", "--out", "{dir}/run", "--device", "cdua"], None, "is not a device"),
    "--device absent here": (["analyze", "--out", "{dir}/run", "--device", "cuda:99"], None,
                             "is not available on this machine (it has: cpu"),
    "--n-devices 0": (["analyze", "--out", "{dir}/run", "--model", "org/model", "--n-devices", "0"], None,
                      "--n-devices must be ≥ 1"),
    "--device-map with a bundled model": (["analyze", "--out", "{dir}/run", "--device-map", "auto"], None,
                                          "--device-map applies to Hugging Face hub models"),
    "corpus is a folder": (["analyze", "--out", "{dir}/run", "--corpus", "{dir}"], lambda f: f.mkdir(), "is a folder"),
    "corpus is a pipe": (["analyze", "--out", "{dir}/run", "--corpus", "{dir}/pipe"],
                         lambda f: (f.mkdir(), __import__("os").mkfifo(f / "pipe")), "is not a regular file"),
    "corpus is empty": (["analyze", "--out", "{dir}/run", "--corpus", ""], None, "corpus '' is empty"),
    "--out a link to nothing": (["analyze", "--out", "{dir}/run"],
                                lambda f: (f.mkdir(), (f / "run").symlink_to(f / "nowhere")), "symbolic link to nothing"),
    "--out name too long": (["analyze", "--out", "{dir}/" + "L" * 300], None, "file systems take at most 255"),
    "stream --seq-len 1": (["stream", "{dir}", "--seq-len", "1"], _finished, "--seq-len must be ≥ 2"),
    "report of a folder being written": (["report", "{dir}"], lambda f: _held(f), "wait for it to finish"),
}


def _held(folder):
    """A finished run whose lock another process holds (here: a child that sleeps)."""
    import subprocess
    import sys

    import tl_geometry as tlg

    from ..tiny import random_tokens, tiny_model

    tlg.analyze(tiny_model(4, 2), random_tokens(2, 8), 1, repeats=1, bootstrap=2, progress=False).save(folder)
    code = (f"from tl_geometry.run.run_folder import RunFolder\nimport time\n"
            f"with RunFolder({str(folder)!r}).writing():\n    print('held', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    _HELD.append(child)


_HELD: list = []


@pytest.fixture(autouse=True)
def _release_held():
    yield
    while _HELD:
        _HELD.pop().kill()


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_exit_2_and_changes_nothing(case, capsys, tmp_path):
    argv, prepare, message = CASES[case]
    folder = tmp_path / "dir"
    if prepare is not None:
        prepare(folder)
    before = snapshot(folder) if folder.exists() else None
    assert main([part.replace("{dir}", str(folder)) for part in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tl-geometry: error: ") and err.count("\n") == 1 and message in err, err
    assert (snapshot(folder) if folder.exists() else None) == before  # nothing written, moved or deleted
    if argv[0] != "analyze" and argv[0] != "compare":
        assert "--out" not in err  # the command has none to offer


def test_a_real_bug_keeps_its_traceback(monkeypatch):
    import tl_geometry.cli.parser as cli

    def broken(args):
        raise RuntimeError("a bug")

    parser = build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser._subparsers._group_actions[0].choices["report"].set_defaults(handler=broken)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["report", "anywhere"])


@pytest.mark.parametrize(("command", "advice"), [("analyze", "--resume"), ("prune", "the single-head scan continues")])
def test_interrupt_advice_fits_the_command(command, advice, capsys, monkeypatch):
    import tl_geometry.cli.parser as cli

    def interrupted(args):
        raise KeyboardInterrupt

    parser = build_parser()
    parser._subparsers._group_actions[0].choices[command].set_defaults(handler=interrupted)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    assert main([command] + (["somewhere"] if command == "prune" else [])) == 130
    err = capsys.readouterr().err
    assert advice in err and (command == "analyze" or "--resume" not in err)


def test_every_option_has_help_and_shows_its_default():
    for name in ("analyze", "prune", "report"):
        sub = build_parser()._subparsers._group_actions[0].choices[name]
        for action in sub._actions:
            if action.dest != "help":
                assert action.help, f"{name} {action.option_strings or action.dest} has no help"
        text = " ".join(sub.format_help().split())
        if name == "analyze":
            assert "(default: smollm2-135m)" in text and "(default: 256; 1024 with" in text and "(default: 64)" in text
            assert "(default: None)" not in text


def test_paper_protocol_sets_the_published_setting_and_flags_override_it(monkeypatch):
    import tl_geometry.cli.options as options
    import tl_geometry.cli.parser as cli

    seen = {}

    def stop(args):
        options.apply_protocol(args)
        seen.update(vars(args))
        raise TLGeometryError("stop")

    for argv, expected in ((["--protocol", "paper"], (1024, "last", "1,2,4,8,16,32", "16")),
                           (["--protocol", "paper", "--seq-len", "512"], (512, "last", "1,2,4,8,16,32", "16")),
                           ([], (256, "last", "1,2,4,8,16,32", "auto"))):
        parser = build_parser()
        parser._subparsers._group_actions[0].choices["analyze"].set_defaults(handler=stop)
        monkeypatch.setattr(cli, "build_parser", lambda parser=parser: parser)
        assert main(["analyze", *argv]) == 2
        assert (seen["seq_len"], seen["queries"], seen["n"], seen["repeats"]) == expected


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
    # TransformerLens's head types once per run, in the table, the manifest, the report and drill-downs
    assert {"previous_token", "duplicate_token", "induction", "head_type"} <= set(heads.columns)
    assert heads.set_index("name").loc["L16H0", "head_type"] == "previous_token"  # 0.88 of its attention
    assert "head_types.safetensors" in json.loads((out / "manifest.json").read_text())["files"]
    report = (out / "report.html").read_text()
    assert "Regimes against TransformerLens" in report and "TransformerLens scores" in report


@pytest.mark.slow
def test_interrupted_analyze_resumes_to_identical_results(capsys, smollm2, tmp_path, monkeypatch):
    import pandas as pd

    import tl_geometry.run.analysis as analysis_module

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
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    for name in (".tl-geometry", "checkpoint.safetensors"):  # an interrupted run of this version
        (fresh / name).write_bytes((tmp_path / "cut" / name).read_bytes())
    assert main([*args[:-1], "--out", str(fresh)]) == 0  # no --resume: the stale checkpoint goes, after the checks
    assert "removed the checkpoint of an earlier interrupted run" in capsys.readouterr().out
    assert not (fresh / "checkpoint.safetensors").exists() and (fresh / "report.html").is_file()
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
    assert "Pruning curves" in page and "Single-head removal" in page
    # the drill-downs, headed by their head and regime in words
    assert re.search(r"<h2>L\d+H\d+, a (retriever|mixer|reset): (the current token|the sink|another token) wins", page)
    assert main(["report", str(tmp_path / "nothing")]) == 2


@pytest.mark.slow
@pytest.mark.parametrize("seq_len", [2, 4])
def test_short_windows_run_to_the_end_and_say_what_is_nan(capsys, smollm2, tmp_path, seq_len):
    out = tmp_path / "short"
    assert main(["analyze", "--windows", "2", "--seq-len", str(seq_len), "--n", "1", "--repeats", "0",
                 "--out", str(out), "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "no checkpoint in" in printed and "starting from the first window" in printed
    assert "NaN means f_random and gap: not measured, the random baseline was skipped (repeats = 0)" in printed
    page = (out / "report.html").read_text()
    assert list(out.glob("drilldown_*.json")) and "Not measurable" in page


def test_report_refuses_a_malformed_derived_table(capsys, tmp_path):
    import pandas as pd

    import tl_geometry as tlg
    from tl_geometry.run.run_folder import RunFolder

    from ..tiny import random_tokens, tiny_model

    run = RunFolder(tmp_path)
    analysis = tlg.analyze(tiny_model(4, 2), random_tokens(2, 8), (1, 2), repeats=1, progress=False, bootstrap=10)
    run_id = run.write_analysis(analysis, {}, {})
    run.write_derived("topn.csv", pd.DataFrame({"n": ["one"], "delta": [0.1]}), run_id)
    before = snapshot(tmp_path)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "topn.csv lacks the columns delta_nll, renormalise" in err
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_context_length_is_checked_before_any_window_is_cut(capsys, smollm2, tmp_path):
    assert main(["analyze", "--seq-len", "8300", "--n", "1", "--windows", "1", "--out", str(tmp_path / "long")]) == 2
    assert "8300 tokens per sequence exceed" in capsys.readouterr().err and not (tmp_path / "long").exists()


@pytest.mark.slow
def test_bfloat16_run_agrees_with_float32(capsys, smollm2, tmp_path):
    import pandas as pd

    args = ["analyze", "--windows", "2", "--seq-len", "64", "--n", "1,2,4", "--repeats", "2", "--quiet"]
    for dtype in ("float32", "bfloat16"):
        assert main([*args, "--dtype", dtype, "--out", str(tmp_path / dtype)]) == 0
    f32, b16 = (pd.read_csv(tmp_path / dtype / "heads.csv") for dtype in ("float32", "bfloat16"))
    assert (f32["regime"] == b16["regime"]).mean() >= 0.9
    assert (f32["f_top@2"] - b16["f_top@2"]).abs().mean() < 0.05


@pytest.mark.slow
def test_a_new_analysis_replaces_the_old_one_and_what_came_from_it(capsys, smollm2, tmp_path):
    out = tmp_path / "run"
    args = ["analyze", "--windows", "1", "--seq-len", "16", "--n", "1,2", "--repeats", "1", "--out", str(out), "--quiet"]
    assert main(args) == 0
    assert main(["prune", str(out), "--windows", "2", "--seq-len", "16", "--scan-windows", "1", "--scan-seq-len", "8",
                 "--quiet"]) == 0
    assert "Pruning curves" in (out / "report.html").read_text()
    before = snapshot(out)
    assert main(args) == 2 and snapshot(out) == before  # refused: nothing changed
    assert main([*args, "--overwrite", "--seed", "1"]) == 0
    assert not (out / "pruning.csv").exists() and "Pruning curves" not in (out / "report.html").read_text()


def test_model_flags_reach_load_model(monkeypatch, capsys, tmp_path):
    import torch

    import tl_geometry.capture.models as models

    seen = {}

    def load_model(name, **options):
        seen.update(options, name=name)
        raise TLGeometryError("stop after loading")

    monkeypatch.setattr(models, "load_model", load_model)
    argv = ["analyze", "--out", str(tmp_path / "run"), "--model", "org/model", "--dtype", "bfloat16", "--device",
            "cpu", "--device-map", "auto", "--n-devices", "2"]  # placement flags apply to hub models
    assert main(argv) == 2 and "stop after loading" in capsys.readouterr().err
    assert seen == {"name": "org/model", "dtype": torch.bfloat16, "device": "cpu", "device_map": "auto",
                    "n_devices": 2}


def _settings(run, **changes):
    import json

    settings = run.read_settings()
    settings.update(changes)
    # the run's own settings file changed by hand: its manifest entry follows, as a user's edit would not
    run.settings.write_text(json.dumps(settings))
    manifest = json.loads(run.manifest.read_text())
    from tl_geometry.io import sha256_file

    manifest["files"]["settings.json"] = {"bytes": run.settings.stat().st_size, "sha256": sha256_file(run.settings)}
    run.manifest.write_text(json.dumps(manifest))


@pytest.mark.parametrize("changes, message", [
    ({"cli_model": "no-such-model"}, "unknown model 'no-such-model'"),
    ({"seed": "x"}, "seed 'x' is not an integer"),
])
def test_prune_checks_the_runs_settings_before_loading(finished_run, capsys, changes, message):
    _settings(finished_run, **changes)
    before = snapshot(finished_run.path)
    assert main(["prune", str(finished_run.path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert snapshot(finished_run.path) == before


def test_non_numeric_derived_tables_are_one_line(finished_run, capsys):
    import pandas as pd

    run_id = finished_run.run_id()
    finished_run.write_derived("topn.csv", pd.DataFrame({"n": ["one"], "delta_nll": [0.1], "renormalise": [False]}),
                               run_id)
    before = snapshot(finished_run.path)
    assert main(["report", str(finished_run.path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "topn.csv, line 2: column 'n' must hold an integer ≥ 1, not 'one'" in err, err
    assert snapshot(finished_run.path) == before


def test_a_settings_file_edited_by_hand_is_named(finished_run, capsys):
    finished_run.settings.write_text("{}")
    assert main(["report", str(finished_run.path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "settings.json" in err and "checksum" in err, err


def test_a_second_writer_is_refused_while_the_first_holds_the_folder(finished_run, capsys):
    from tl_geometry.run.run_folder import RunFolder

    with RunFolder(finished_run.path).writing():  # another process's analysis or prune, still running
        before = snapshot(finished_run.path)
        assert main(["report", str(finished_run.path)]) == 2
        assert snapshot(finished_run.path) == before
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is being written by tl-geometry pid" in err, err
    assert main(["report", str(finished_run.path)]) == 0  # once it is done


@pytest.mark.parametrize("gap, said", [(1e-7, False), (0.012, True)])
def test_the_summary_names_heads_and_says_n1_only_when_it_shows(gap, said):
    """N = 1 (F = 1 by definition in a Euclidean run) is left out unless its gap shows; each regime
    is said with its meaning and its surest heads, and the uncertain labels are named."""
    import pandas as pd

    import tl_geometry as tlg
    from tl_geometry.cli.commands import _say_results
    from tl_geometry.heads import head_name
    from tl_geometry.label.taxonomy import regime_gloss

    from ..tiny import random_tokens, tiny_model

    res = tlg.analyze(tiny_model(4, 2), random_tokens(3, 12, seed=4), (1, 2), repeats=1, bootstrap=5, progress=False)
    summary = pd.DataFrame({"n": [1, 2], "f_top": [1.0, 0.7], "f_top_low": [1.0, 0.6], "f_top_high": [1.0, 0.8],
                            "f_random": [1.0 - gap, 0.3], "gap": [gap, 0.4], "gap_low": [gap, 0.3], "gap_high": [gap, 0.5]})
    res.geometry.summary = lambda: summary  # the figures of a run whose N = 1 gap is `gap`
    lines = []
    _say_results(res, "last", lines.append)
    assert any("N=1 gap above 0" in line for line in lines) == said
    assert any(line.startswith("  N=1 ") for line in lines) == said
    assert any("N=1 left out: F = 1 by definition" in line for line in lines) == (not said)
    for regime, heads in res.taxonomy.clearest(3).items():
        line = next(line for line in lines if regime_gloss(regime, familiar=True) in line)
        assert all(head_name(*head) in line for head in heads) and ("surest: " in line) == bool(heads)
    uncertain = res.uncertain_heads()
    assert any(line.startswith(f"  {len(uncertain)} uncertain label") and uncertain[0] in line for line in lines) == bool(uncertain)


@pytest.mark.slow
def test_stream_fills_the_run_and_its_report(capsys, smollm2, tmp_path):
    import pandas as pd

    out = tmp_path / "run"
    assert main(["analyze", "--windows", "2", "--seq-len", "24", "--n", "1,2", "--repeats", "1", "--out", str(out),
                 "--quiet"]) == 0
    args = ["stream", str(out), "--windows", "1", "--seq-len", "32", "--window", "8", "--sink", "2",
            "--orders", "taxonomy,random,oracle", "--fractions", "0.5,1", "--seeds", "1", "--quiet"]
    from tl_geometry.run.checkpoint import KeyedCheckpoint

    # A checkpoint that cannot be resumed (another job's) is removed, as analyze removes an earlier run's.
    KeyedCheckpoint(out / "stream_checkpoint.safetensors", {"other": 1}, "single-head scan").save({})
    assert main(args) == 0
    table = pd.read_csv(out / "streaming.csv")
    assert set(table["order"]) == {"taxonomy", "random", "oracle"} and set(table["fraction"]) == {0.5, 1.0}
    at_one = table[table.fraction == 1.0]["delta_nll"]
    assert at_one.nunique() == 1  # every order streams every kv head at fraction 1
    assert not (out / "stream_checkpoint.json").exists()
    assert "Streaming kv heads" in (out / "report.html").read_text()
    # the best measured order (the oracle's area is 0) as a DuoAttention pattern of this analysis
    from tl_geometry import Analysis
    from tl_geometry.intervene.duo_attention import DuoAttentionPattern

    pattern = DuoAttentionPattern.load(out / "duo_attention")
    assert (pattern.order, pattern.sink_size, pattern.recent_size) == ("oracle", 2, 8)
    assert pattern.settings["run_id"] == Analysis.load(out).geometry.settings["run_id"] and pattern.scores.shape == (30, 3)
    assert "Streaming heads exported for kvpress" in (out / "report.html").read_text()
    (out / "duo_attention" / "full_attention_heads.tsv").write_text("0.5\t2.0\n")  # damaged: one line, exit 2
    assert main(["report", str(out)]) == 2
    assert "full_attention_heads.tsv must hold one row per layer" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--orders", "taxonomy,magic"], "unknown streaming order 'magic'"),
    (["--fractions", "0.5,1.5"], "--fractions must lie in (0, 1]"),
    (["--window", "1020", "--seq-len", "1024"], "keeps every key of 1024-token windows"),
    (["--window", "1020"], "keeps every key of 1024-token windows"),  # the paper's length by default
    (["--protocol", "default", "--window", "252"], "keeps every key of 256-token windows"),
    (["--window", "0"], "window must be an int ≥ 1"),
    (["--sink", "-1"], "sink must be an int ≥ 0"),
])
def test_stream_refuses_bad_input_in_one_line(finished_run, capsys, flags, message):
    before = snapshot(finished_run.path)
    assert main(["stream", str(finished_run.path), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert snapshot(finished_run.path) == before


@pytest.mark.slow
def test_stream_refuses_a_run_of_another_model(finished_run, capsys):
    # the run's analysis is of a tiny model; its settings name SmolLM2
    before = snapshot(finished_run.path)
    assert main(["stream", str(finished_run.path), "--seq-len", "64", "--window", "8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pass the analysis of this model" in err
    assert snapshot(finished_run.path) == before


@pytest.mark.slow
@pytest.mark.parametrize("command", [["stream", "--seq-len", "9000"], ["prune", "--seq-len", "9000"],
                                     ["prune", "--seq-len", "9000", "--scan-seq-len", "9000"]])
def test_lengths_past_the_context_are_refused_before_any_work(finished_run, capsys, command):
    before = snapshot(finished_run.path)
    assert main([command[0], str(finished_run.path), *command[1:]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "9000 tokens per sequence exceed" in err and "context of 8192" in err, err
    assert snapshot(finished_run.path) == before


def test_threads_hold_for_the_command_and_are_restored(monkeypatch, tmp_path):
    import torch

    import tl_geometry.cli.parser as cli

    seen = []
    monkeypatch.setattr(cli, "stream_command", lambda args: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    assert main(["stream", str(tmp_path), "--threads", "1"]) == 0
    assert seen == [1] and torch.get_num_threads() == before


def test_a_notebook_saved_run_of_a_bundled_model_needs_no_model_flag(tmp_path):
    # Analysis.save writes the model as it names itself, not the CLI's name: prune and stream map it
    import argparse
    import dataclasses
    import warnings

    import tl_geometry as tlg
    from tl_geometry.cli.derived_jobs import _finished_run

    from ..tiny import random_tokens, tiny_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        analysis = tlg.analyze(tiny_model(4, 2), random_tokens(2, 12, seed=1), (1, 2), repeats=1, bootstrap=10,
                               progress=False)
    named = {**analysis.geometry.settings, "model": "HuggingFaceTB/SmolLM2-135M-Instruct"}
    analysis = dataclasses.replace(analysis, geometry=dataclasses.replace(analysis.geometry, settings=named))
    analysis.save(tmp_path / "run")
    assert _finished_run(argparse.Namespace(run=str(tmp_path / "run"), model=None))[2] == "smollm2-135m"


@pytest.mark.parametrize("command", [[], ["analyze"], ["prune", "x"], ["stream", "x"], ["report", "x"], ["compare", "a", "b"]])
def test_help_is_plain_text(command, capsys):
    """--help speaks to users: no reST markup from the docstrings (``x``, :class:), the labels' meanings."""
    with pytest.raises(SystemExit):
        main([*command[:1], "--help"])
    out = capsys.readouterr().out
    assert "`" not in out and ":class:" not in out and ":func:" not in out, out
    if not command:
        assert "mixer (the sink wins)" in " ".join(out.split())
