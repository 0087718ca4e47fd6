"""The run folder: a finished analysis is never silently replaced, derived tables belong to their
analysis, unreadable files are one clear error."""

from __future__ import annotations

import hashlib

import pandas as pd
import pytest

import tl_geometry as tlg
from tl_geometry.errors import TLGeometryError
from tl_geometry.run_folder import RunFolder

from .tiny import random_tokens, tiny_model


@pytest.fixture(scope="module")
def two_analyses():
    model = tiny_model(4, 2)
    run = lambda seed: tlg.analyze(model, random_tokens(2, 12, seed=seed), (1, 2), repeats=1, bootstrap=10,  # noqa: E731
                                   progress=False)
    return run(1), run(2)


def snapshot(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


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
    tables, foreign = run.read_derived(first_id)
    assert list(tables) == ["pruning.csv"] and foreign == []
    assert run.read_derived("another-analysis") == ({}, ["pruning.csv"])
    second_id = run.write_analysis(second, {}, {})
    assert second_id != first_id
    # The new analysis takes the old one's derived tables and drill-downs with it.
    assert not (tmp_path / "pruning.csv").exists() and not (tmp_path / "drilldown_mixer.json").exists()
    # A table whose manifest entry is missing (e.g. copied in by hand) is not attributed to it.
    PRUNING.to_csv(tmp_path / "pruning.csv", index=False)
    assert run.read_derived(second_id) == ({}, ["pruning.csv"])


def test_folders_written_before_run_ids_keep_their_derived_tables(tmp_path, two_analyses):
    first, _ = two_analyses
    first.save(tmp_path)  # the previous layout: no run_id, no derived.json
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
        run.read_analysis()


def test_malformed_derived_table_is_one_clear_error(tmp_path, two_analyses):
    run = RunFolder(tmp_path)
    run_id = run.write_analysis(two_analyses[0], {}, {})
    run.write_derived("pruning.csv", pd.DataFrame({"something": [1]}), run_id)
    with pytest.raises(TLGeometryError, match="pruning.csv lacks the columns method, retention"):
        run.read_derived(run_id)
