"""The run folder: a finished analysis is never silently replaced, derived tables belong to their
analysis, unreadable files are one clear error."""

from __future__ import annotations

import hashlib

import pandas as pd
import pytest
import torch

import tl_geometry as tlg
from tl_geometry.errors import TLGeometryError
from tl_geometry.run.run_folder import RunFolder

from ..tiny import random_tokens, tiny_model


@pytest.fixture(scope="module")
def two_analyses():
    model = tiny_model(4, 2)
    run = lambda seed: tlg.analyze(model, random_tokens(2, 12, seed=seed), (1, 2), repeats=1, bootstrap=10,  # noqa: E731
                                   progress=False)
    return run(1), run(2)


def snapshot(folder) -> dict[str, str]:
    """Checksums of a folder's files (other entries, e.g. a named pipe, by kind: reading one would block)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "not a file"
            for p in sorted(folder.iterdir())}


def legacy_save(analysis, folder) -> None:
    """A run folder as versions before markers and manifests wrote it: the two result files."""
    folder.mkdir(parents=True, exist_ok=True)
    analysis.geometry.save(folder / "geometry.safetensors")
    analysis.taxonomy.save(folder / "taxonomy.safetensors")


PRUNING = pd.DataFrame({"method": ["random"], "retention": [1.0], "heads_removed": [0], "delta_nll": [0.0]})


def test_a_finished_analysis_is_replaced_only_on_request(tmp_path, two_analyses):
    first, second = two_analyses
    run = RunFolder(tmp_path / "run")
    run.check_new_analysis(overwrite=False, resume=False)
    assert not run.path.exists()  # checking creates nothing
    run.create()
    first_id = run.write_analysis(first, {"model": "tiny"}, {})
    assert run.is_finished and run.run_id() == first_id and run.read_settings()["run_id"] == first_id
    before = snapshot(run.path)
    with pytest.raises(TLGeometryError, match="already holds a finished analysis.*--overwrite"):
        run.check_new_analysis(overwrite=False, resume=False)
    with pytest.raises(TLGeometryError, match="nothing to resume"):
        run.check_new_analysis(overwrite=False, resume=True)
    assert snapshot(run.path) == before
    run.check_new_analysis(overwrite=True, resume=False)
    assert {"geometry.safetensors", "taxonomy.safetensors", "settings.json", "heads.csv", "summary.csv"} <= set(before)


def test_derived_tables_belong_to_their_analysis(tmp_path, two_analyses):
    first, second = two_analyses
    run = RunFolder(tmp_path)
    first_id = run.write_analysis(first, {}, {"mixer": "{}"})
    run.write_derived("pruning.csv", PRUNING, first_id)
    tables, left_out = run.read_derived(first_id)
    assert list(tables) == ["pruning.csv"] and left_out == {}
    earlier = {"pruning.csv": "computed from an earlier analysis; rerun tl-geometry prune"}
    assert run.read_derived("another-analysis") == ({}, earlier)
    second_id = run.write_analysis(second, {}, {})
    assert second_id != first_id
    # The new analysis takes the old one's derived tables and drill-downs with it.
    assert not (tmp_path / "pruning.csv").exists() and not (tmp_path / "drilldown_mixer.json").exists()
    # A table whose manifest entry is missing (e.g. copied in by hand) is not attributed to it.
    PRUNING.to_csv(tmp_path / "pruning.csv", index=False)
    assert run.read_derived(second_id) == ({}, earlier)
    # An unreadable derived.json trusts no table, and says so (not "an earlier analysis").
    run.derived_manifest.write_text("{damaged")
    assert "derived.json, which says which analysis it belongs to, is unreadable" in run.read_derived(second_id)[1][
        "pruning.csv"]


def test_folders_written_before_run_ids_keep_their_derived_tables(tmp_path, two_analyses):
    first, _ = two_analyses
    legacy_save(first, tmp_path)  # the previous layout: no run_id, no derived.json
    PRUNING.to_csv(tmp_path / "pruning.csv", index=False)
    run = RunFolder(tmp_path)
    assert run.run_id() is None and list(run.read_derived(None)[0]) == ["pruning.csv"]


@pytest.mark.parametrize("content", [b"", b"garbage" * 5, None], ids=["empty", "garbage", "truncated"])
def test_unreadable_results_name_the_file(tmp_path, two_analyses, content):
    run = RunFolder(tmp_path)
    run.write_analysis(two_analyses[0], {}, {})
    data = run.geometry.read_bytes()
    run.geometry.write_bytes(data[: len(data) // 2] if content is None else content)
    with pytest.raises(TLGeometryError, match=f"cannot read {run.geometry}.*rerun"):
        tlg.Analysis.load(run.path)


def test_malformed_derived_table_is_one_clear_error(tmp_path, two_analyses):
    run = RunFolder(tmp_path)
    run_id = run.write_analysis(two_analyses[0], {}, {})
    run.write_derived("pruning.csv", pd.DataFrame({"something": [1]}), run_id)
    with pytest.raises(TLGeometryError, match="pruning.csv lacks the columns method, retention"):
        run.read_derived(run_id)


def test_overwrite_removes_only_what_tl_geometry_wrote(tmp_path, two_analyses):
    first, second = two_analyses
    run = RunFolder(tmp_path / "run")
    run.create()
    first_id = run.write_analysis(first, {}, {"mixer": "{}"})
    run.write_derived("pruning.csv", PRUNING, first_id)
    (run.path / "drilldown_mine.json").write_text("the user's own figure")
    (run.path / "notes.txt").write_text("the user's notes")
    run.report.write_text("the first analysis's report")
    run.write_analysis(second, {}, {})
    assert not (run.path / "pruning.csv").exists() and not (run.path / "drilldown_mixer.json").exists()
    assert not run.report.exists()  # it described the replaced analysis
    assert (run.path / "drilldown_mine.json").read_text() == "the user's own figure"
    assert (run.path / "notes.txt").read_text() == "the user's notes"


def test_a_foreign_folder_is_refused_before_anything_changes(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "settings.json").write_text("mine")
    before = snapshot(folder)
    for overwrite in (False, True):
        with pytest.raises(TLGeometryError, match="not empty and was not written by tl-geometry"):
            RunFolder(folder).check_new_analysis(overwrite=overwrite, resume=False)
    assert snapshot(folder) == before
    RunFolder(tmp_path / "empty").check_new_analysis(overwrite=False, resume=False)  # new folders are fine
    (tmp_path / "empty").mkdir()
    RunFolder(tmp_path / "empty").check_new_analysis(overwrite=False, resume=False)  # and empty ones


def test_the_manifest_comes_last_and_readers_check_it(tmp_path, two_analyses, monkeypatch):
    first, second = two_analyses
    run = RunFolder(tmp_path / "run")
    run.write_analysis(first, {}, {})
    assert run.is_finished and not run.is_interrupted
    run.verify()
    # A crash while the new files are written (under temporary names): the old analysis stays whole.
    from tl_geometry.io import Staging
    from tl_geometry.label.taxonomy import HeadTaxonomy

    def crash(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(HeadTaxonomy, "save", crash)
    before = snapshot(run.path)
    with pytest.raises(KeyboardInterrupt):
        run.write_analysis(second, {}, {})
    monkeypatch.undo()
    assert snapshot(run.path) == before and run.is_finished
    assert torch.equal(tlg.Analysis.load(run.path).taxonomy.votes, first.taxonomy.votes)
    # A crash while they are swapped in: no manifest, so not finished; readers say so.
    monkeypatch.setattr(Staging, "commit", crash)
    with pytest.raises(KeyboardInterrupt):
        run.write_analysis(second, {}, {})
    monkeypatch.undo()
    assert run.is_interrupted and not run.is_finished and not list(run.path.glob(".*.staged"))
    for read in (run.verify, lambda: tlg.Analysis.load(run.path)):
        with pytest.raises(TLGeometryError, match="interrupted while saving.*--resume"):
            read()
    with pytest.raises(TLGeometryError, match="interrupted while saving.*--resume"):
        run.check_new_analysis(overwrite=False, resume=False)
    run.check_new_analysis(overwrite=False, resume=True)
    run.write_analysis(second, {}, {})  # the rerun repairs it
    run.verify()
    # A result changed after the run wrote it (same size): its checksum says so.
    data = bytearray(run.taxonomy.read_bytes())
    data[-1] ^= 1
    run.taxonomy.write_bytes(bytes(data))
    with pytest.raises(TLGeometryError, match="cannot read .*taxonomy.safetensors.*checksum"):
        tlg.Analysis.load(run.path)


def test_one_writer_at_a_time(tmp_path):
    run = RunFolder(tmp_path / "run")
    with run.writing():
        with pytest.raises(TLGeometryError, match=r"is being written by tl-geometry pid \d+"):
            with RunFolder(tmp_path / "run").writing():
                pass
    with run.writing():  # released on leaving: the next writer gets it
        pass


def test_a_dead_writer_leaves_no_lock(tmp_path):
    import subprocess
    import sys

    code = ("from tl_geometry.run.run_folder import RunFolder; import os\n"
            f"w = RunFolder({str(tmp_path / 'run')!r}).writing(); w.__enter__(); os._exit(1)")
    subprocess.run([sys.executable, "-c", code], check=False)
    assert (tmp_path / "run" / ".tl-geometry.writer").read_text().startswith("tl-geometry pid")
    with RunFolder(tmp_path / "run").writing():  # the dead process's lock went with it
        pass


def test_result_files_of_two_analyses_or_without_metadata_are_one_error(tmp_path, two_analyses):
    from tl_geometry.io import load_tensors, save_tensors

    first, _ = two_analyses
    legacy_save(first, tmp_path)  # an unmarked folder, as versions before markers wrote
    other = tlg.HeadTaxonomy.from_votes(torch.ones(5, 4, 3, dtype=torch.long))
    other.save(tmp_path / "taxonomy.safetensors")
    with pytest.raises(TLGeometryError, match="holds results of two analyses"):
        tlg.Analysis.load(tmp_path)
    tensors, meta = load_tensors(tmp_path / "geometry.safetensors", "GeometryResult")
    tensors.pop("window_ids")
    save_tensors(tmp_path / "geometry.safetensors", "GeometryResult", tensors, **meta)
    with pytest.raises(TLGeometryError, match="window_ids, n or settings are missing"):
        tlg.Analysis.load(tmp_path)


def test_overwriting_a_folder_from_before_markers_clears_its_old_outputs(tmp_path, two_analyses):
    first, second = two_analyses
    legacy_save(first, tmp_path)  # the previous layout: results, no marker, no manifest
    for name in ("drilldown_mixer.json", "pruning.csv"):
        (tmp_path / name).write_text("old")
    (tmp_path / "notes.txt").write_text("the user's")
    run = RunFolder(tmp_path)
    run.check_new_analysis(overwrite=True, resume=False)
    run.write_analysis(second, {}, {})
    assert not (tmp_path / "drilldown_mixer.json").exists() and not (tmp_path / "pruning.csv").exists()
    assert (tmp_path / "notes.txt").read_text() == "the user's" and run.is_owned and run.is_finished


def _finished_cli_run(folder, analysis):
    run = RunFolder(folder)
    run.write_analysis(analysis.with_head_types(_types(analysis)), {"cli_model": "smollm2-135m"}, {"mixer": "{}"})


def _types(analysis):
    return tlg.HeadTypes(*(torch.zeros(analysis.taxonomy.shape) for _ in range(3)))


def _users_folder(folder, analysis):
    folder.mkdir()
    (folder / "geometry.safetensors").write_text("the user's own file of that name")
    (folder / "head_types.safetensors").write_text("the user's own scores")


def _interrupted_save(folder, analysis):
    _finished_cli_run(folder, analysis)
    (folder / "manifest.json").unlink()


def _dangling(folder, analysis):
    folder.symlink_to(folder.parent / "nowhere")


# Analysis.save: (how the folder is prepared, the path saved to, what the one line says).
SAVE_REFUSALS = {
    "into a finished run": (_finished_cli_run, "run", "already holds a finished analysis: pass overwrite=True to "
                                                      "replace it"),
    "into a user's folder": (_users_folder, "run", "was not written by tl-geometry"),
    "into a user's folder, overwrite": (_users_folder, "run", "overwrite=True never replaces files tl-geometry did "
                                                             "not write"),
    "into a run interrupted while saving": (_interrupted_save, "run", "interrupted while saving its results: pass "
                                                                     "overwrite=True"),
    "below a file": (lambda f, a: (f.mkdir(), (f / "file.py").write_text("x")), "run/file.py/x",
                     "file.py' is not a folder; save to another folder"),
    "a 300-character name": (lambda f, a: f.mkdir(), "run/" + "L" * 300, "has a name of 300 bytes"),
    "onto a file": (lambda f, a: (f.mkdir(), (f / "file.py").write_text("x")), "run/file.py",
                    "is a file, not a folder: save to another folder"),
    "a link to nothing": (_dangling, "run", "is a symbolic link to nothing"),
}


@pytest.mark.parametrize("case", list(SAVE_REFUSALS))
def test_save_refuses_in_one_line_and_changes_nothing(case, tmp_path, two_analyses):
    prepare, name, message = SAVE_REFUSALS[case]
    first, second = two_analyses
    prepare(tmp_path / "run", first)
    before = snapshot(tmp_path)
    inside = snapshot(tmp_path / "run") if (tmp_path / "run").is_dir() else None
    with pytest.raises(TLGeometryError) as error:
        second.save(tmp_path / name, overwrite=case.endswith("overwrite"))
    assert message in str(error.value) and "\n" not in str(error.value) and "--" not in str(error.value), error.value
    assert snapshot(tmp_path) == before
    if (tmp_path / "run").is_dir() and not (tmp_path / "run").is_symlink():
        assert snapshot(tmp_path / "run") == inside


def test_a_saved_analysis_is_a_finished_run_for_every_command(tmp_path, two_analyses, capsys):
    from tl_geometry.cli.parser import main

    first, second = two_analyses
    first.save(tmp_path / "a")
    second.save(tmp_path / "b")
    run = RunFolder(tmp_path / "a")
    assert run.is_owned and run.is_finished and not run.is_interrupted
    run.verify()
    assert main(["report", str(run.path)]) == 0  # the README's notebook workflow
    assert run.is_finished and not run.is_interrupted  # the report left it a finished run
    assert torch.equal(tlg.Analysis.load(run.path).taxonomy.votes, first.taxonomy.votes)
    assert main(["compare", str(run.path), str(tmp_path / "b"), "--out", str(tmp_path / "c")]) == 0
    assert main(["report", str(run.path)]) == 0  # again: still finished


def test_save_replaces_only_on_request_and_only_what_tl_geometry_wrote(tmp_path, two_analyses):
    first, second = two_analyses
    _finished_cli_run(tmp_path / "run", first)
    (tmp_path / "run" / "notes.txt").write_text("the user's notes")
    second.save(tmp_path / "run", overwrite=True)
    loaded = tlg.Analysis.load(tmp_path / "run")
    assert torch.equal(loaded.taxonomy.votes, second.taxonomy.votes) and loaded.head_types.settings == second.head_types.settings
    assert not (tmp_path / "run" / "drilldown_mixer.json").exists()  # the replaced run's, listed in its manifest
    assert (tmp_path / "run" / "notes.txt").read_text() == "the user's notes"


def test_report_leaves_a_folder_from_before_markers_as_it_was(tmp_path, two_analyses, capsys):
    from tl_geometry.cli.parser import main

    legacy_save(two_analyses[0], tmp_path / "old")
    assert main(["report", str(tmp_path / "old")]) == 0
    run = RunFolder(tmp_path / "old")
    assert run.is_legacy and not run.is_interrupted and not run.marker.exists()
    tlg.Analysis.load(run.path)
    assert main(["report", str(run.path)]) == 0


def test_the_cli_imports_and_locks_without_fcntl(tmp_path, two_analyses):
    """Where ``fcntl`` does not exist (Windows), the lock is filelock's and the CLI still runs."""
    import subprocess
    import sys

    legacy_save(two_analyses[0], tmp_path / "old")  # written without any lock
    code = ("import sys, warnings; sys.modules['fcntl'] = None; warnings.simplefilter('ignore')\n"
            "import tl_geometry as tlg\n"
            "from tl_geometry.cli import main\n"
            "from tl_geometry.run.run_folder import RunFolder\n"
            f"tlg.Analysis.load({str(tmp_path / 'old')!r}).save({str(tmp_path / 'run')!r})\n"
            f"assert main(['report', {str(tmp_path / 'run')!r}]) == 0\n"
            f"with RunFolder({str(tmp_path / 'run')!r}).writing():\n"
            f"    assert main(['report', {str(tmp_path / 'run')!r}]) == 2\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "is being written by tl-geometry pid" in done.stderr and "--out" not in done.stderr


# ----- nothing lost, round five: manifests inside their folder, folders known by content, resumes
# that never touch a finished analysis, copies without the marker still checked ---------------------

@pytest.mark.parametrize("name", ["../outside.txt", "/ABSOLUTE", "sub/inner.txt", ".."])
def test_a_manifest_naming_files_outside_its_folder_deletes_nothing(name, tmp_path, two_analyses):
    import json

    first, second = two_analyses
    first.save(tmp_path / "run")
    outside = tmp_path / "outside.txt"
    outside.write_text("the user's file")
    (tmp_path / "run" / "sub").mkdir()
    (tmp_path / "run" / "sub" / "inner.txt").write_text("the user's other file")
    target = str(outside) if name == "/ABSOLUTE" else name
    manifest = tmp_path / "run" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["files"][target] = {"bytes": 15, "sha256": "0" * 64}
    manifest.write_text(json.dumps(data))
    before = snapshot(tmp_path)
    for attempt in (lambda: second.save(tmp_path / "run", overwrite=True), lambda: tlg.Analysis.load(tmp_path / "run")):
        with pytest.raises(TLGeometryError, match="is not a file of that folder") as error:
            attempt()
        assert "overwrite" not in str(error.value)  # no advice that would act on the folder
    assert snapshot(tmp_path) == before and outside.read_text() == "the user's file"


def test_a_users_files_named_like_results_are_not_a_run_folder(tmp_path, two_analyses):
    first, _ = two_analyses
    folder = tmp_path / "mine"
    folder.mkdir()
    for name in ("geometry.safetensors", "taxonomy.safetensors"):  # the user's own tensors, another kind
        from safetensors.torch import save_file

        save_file({"w": torch.ones(2)}, str(folder / name))
    (folder / "report.html").write_text("<p>mine</p>")
    (folder / "drilldown_mine.json").write_text("{}")
    before = snapshot(folder)
    run = RunFolder(folder)
    assert not run.is_legacy and not run.is_finished
    with pytest.raises(TLGeometryError, match="was not written by tl-geometry"):
        first.save(folder, overwrite=True)
    with pytest.raises(TLGeometryError, match="does not hold a GeometryResult"):
        tlg.Analysis.load(folder)
    assert snapshot(folder) == before


def test_resume_never_replaces_a_finished_analysis(tmp_path, two_analyses):
    first, _ = two_analyses
    run = RunFolder(tmp_path / "run")
    run.create()
    run.checkpoint.write_text("an interrupted run's state")
    run.write_analysis(first, {"model": "tiny"}, {})
    assert not run.checkpoint.exists()  # the checkpoint goes when the manifest is written
    run.checkpoint.write_text("left by a run stopped while writing its report")
    with pytest.raises(TLGeometryError, match="finished analysis: nothing to resume.*tl-geometry report"):
        run.check_new_analysis(overwrite=False, resume=True)


def test_the_interrupt_advice_follows_the_folder(tmp_path, two_analyses, capsys, monkeypatch):
    import tl_geometry.cli.parser as cli
    from tl_geometry.cli.parser import build_parser, main

    def interrupted(args):
        raise KeyboardInterrupt

    parser = build_parser()
    parser._subparsers._group_actions[0].choices["analyze"].set_defaults(handler=interrupted)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    assert main(["analyze", "--out", str(tmp_path / "run")]) == 130
    assert "with --resume to continue" in capsys.readouterr().err
    two_analyses[0].save(tmp_path / "run")  # saved before the interrupt: only the report was left
    assert main(["analyze", "--out", str(tmp_path / "run")]) == 130
    err = capsys.readouterr().err
    assert f"write its report with tl-geometry report {tmp_path / 'run'}" in err and "--resume" not in err


def test_a_copy_without_the_marker_is_still_checked(tmp_path, two_analyses):
    import shutil

    first, _ = two_analyses
    first.save(tmp_path / "run")
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in (tmp_path / "run").iterdir():  # cp -r run/* copy/: the hidden marker stays behind
        if not path.name.startswith("."):
            shutil.copy(path, copy / path.name)
    tlg.Analysis.load(copy)
    data = bytearray((copy / "taxonomy.safetensors").read_bytes())
    data[-1] ^= 1
    (copy / "taxonomy.safetensors").write_bytes(bytes(data))
    with pytest.raises(TLGeometryError, match="checksum differs"):
        tlg.Analysis.load(copy)


@pytest.mark.parametrize("lock", ["a folder", "a link to nowhere"])
def test_an_unusable_lock_file_is_one_line(lock, tmp_path, two_analyses):
    run = RunFolder(tmp_path / "run")
    run.create()
    if lock == "a folder":
        (run.path / ".tl-geometry.lock").mkdir()
    else:
        (run.path / ".tl-geometry.lock").symlink_to(tmp_path / "missing" / "lock")
    with pytest.raises(TLGeometryError, match=r"cannot lock .*\.tl-geometry\.lock.*remove or repair it"):
        two_analyses[0].save(run.path)


def test_a_home_relative_folder_is_the_home_folders(tmp_path, two_analyses, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    two_analyses[0].save("~/saved")
    assert (tmp_path / "home" / "saved" / "manifest.json").is_file() and not (tmp_path / "~").exists()
    assert torch.equal(tlg.Analysis.load("~/saved").taxonomy.votes, two_analyses[0].taxonomy.votes)


def test_an_interrupted_prune_credits_none_of_the_earlier_runs_tables(tmp_path, two_analyses):
    first, _ = two_analyses
    run = RunFolder(tmp_path / "run")
    run.create()
    run_id = run.write_analysis(first, {"model": "tiny"}, {})
    run.write_derived("pruning.csv", PRUNING, run_id)
    run.write_derived("topn.csv", pd.DataFrame({"n": [1], "delta_nll": [0.3], "renormalise": [False]}), run_id)
    run.forget_derived(("pruning.csv", "single_head_scan.csv", "topn.csv"))  # a second prune starts...
    run.write_derived("pruning.csv", PRUNING.assign(delta_nll=0.5), run_id)  # ...and stops after its first table
    tables, left_out = run.read_derived(run_id)
    assert list(tables) == ["pruning.csv"] and tables["pruning.csv"]["delta_nll"].tolist() == [0.5]
    assert list(left_out) == ["topn.csv"]
