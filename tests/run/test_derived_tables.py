"""Derived tables are checked row by row where they are read: a header-only file, a short row or
a value out of range is one line naming the file, the line and the command that rewrites it, in
the report (CLI) and in Python, and nothing in the folder changes."""

from __future__ import annotations

import pandas as pd
import pytest

import tl_geometry as tlg
from tl_geometry.cli.parser import main
from tl_geometry.errors import TLGeometryError
from tl_geometry.present.report import derived_results

from .test_run_folder import snapshot

GOOD = {
    "pruning.csv": pd.DataFrame({"method": ["random"], "retention": [0.5], "heads_removed": [6], "delta_nll": [0.1]}),
    "single_head_scan.csv": pd.DataFrame({"layer": [layer for layer in range(3) for _ in range(4)],
                                          "head": [head for _ in range(3) for head in range(4)],
                                          "name": [f"L{layer}H{head}" for layer in range(3) for head in range(4)],
                                          "delta_nll": [0.2 + 0.01 * k for k in range(12)], "scan_windows": 2,
                                          "scan_seq_len": 8}),
    "topn.csv": pd.DataFrame({"n": [1], "delta_nll": [0.3], "renormalise": [False]}),
    "streaming.csv": pd.DataFrame({"order": ["random"], "seed": [0], "fraction": [0.5], "kv_heads_streamed": [3],
                                   "delta_nll": [0.1], "window": [4], "sink": [1], "seq_len": [16], "n_kv_total": [6],
                                   "baseline_nll": [2.0]}),
}

# (table, how its CSV text is damaged, what the one line says besides the file's name)
DAMAGED = {
    "streaming.csv header only": ("streaming.csv", lambda text: text.splitlines()[0] + "\n",
                                  "has no rows (only its header): rerun tl-geometry stream"),
    "streaming.csv short row": ("streaming.csv", lambda text: text + "random,1,0.5\n",
                                "line 3: column 'delta_nll' must hold a finite number, not nothing: rerun tl-geometry stream"),
    "streaming.csv fraction 1.7": ("streaming.csv", lambda text: text.replace(",0.5,", ",1.7,"),
                                   "line 2: column 'fraction' must hold a share in (0, 1], not 1.7: rerun tl-geometry "
                                   "stream"),
    "streaming.csv unknown order": ("streaming.csv", lambda text: text.replace("random", "magic"),
                                    "line 2: column 'order' must hold a streaming order"),
    "streaming.csv baseline 0": ("streaming.csv", lambda text: text.replace(",2.0", ",0.0"),
                                 "column 'baseline_nll' must hold a positive number, not 0.0"),
    "streaming.csv empty file": ("streaming.csv", lambda text: "", "cannot read"),
    "pruning.csv retention 2": ("pruning.csv", lambda text: text.replace(",0.5,", ",2,"),
                                "line 2: column 'retention' must hold a share in [0, 1], not 2: rerun tl-geometry prune"),
    "pruning.csv no method": ("pruning.csv", lambda text: text.replace("random", ""),
                              "column 'method' must hold text, not nothing"),
    "pruning.csv a row twice": ("pruning.csv", lambda text: text + text.splitlines()[1] + "\n",
                                "line 3: a second row for the same method, retention: rerun tl-geometry prune"),
    "topn.csv n 0": ("topn.csv", lambda text: text.replace("1,0.3", "0,0.3"), "column 'n' must hold an integer ≥ 1"),
    "topn.csv renormalise maybe": ("topn.csv", lambda text: text.replace("False", "maybe"),
                                   "column 'renormalise' must hold True or False, not 'maybe'"),
    "single_head_scan.csv layer -1": ("single_head_scan.csv", lambda text: text.replace("\n0,1,", "\n-1,1,"),
                                      "column 'layer' must hold an integer ≥ 0, not -1"),
    "single_head_scan.csv head 1.5": ("single_head_scan.csv", lambda text: text.replace("\n0,1,", "\n0,1.5,"),
                                      "column 'head' must hold an integer ≥ 0, not 1.5"),
    "single_head_scan.csv head beyond the model": ("single_head_scan.csv", lambda text: text.replace("\n0,1,", "\n0,99,"),
                                                   "does not cover the analysis's 3×4 heads (L0H1): rerun tl-geometry prune"),
    "single_head_scan.csv half the heads": ("single_head_scan.csv", lambda text: "\n".join(text.splitlines()[:7]) + "\n",
                                            "does not cover the analysis's 3×4 heads (L1H2): rerun tl-geometry prune"),
    "single_head_scan.csv two scans": ("single_head_scan.csv", lambda text: text.replace(",2,8\n", ",4,64\n", 1),
                                       "column 'scan_windows' differs between rows"),
    "streaming.csv rows of two runs": ("streaming.csv", lambda text: text + "random,0,0.25,2,0.05,8,1,16,6,2.0\n",
                                       "column 'window' differs between rows"),
    "pruning.csv a hole in a curve": ("pruning.csv", lambda text: text + "magnitude,0.5,6,0.2\nmagnitude,0.25,9,0.3\n",
                                      "has no row for retention 0.25: the table is incomplete; rerun tl-geometry prune"),
    "pruning.csv a bad cell on line 3": ("pruning.csv", lambda text: text + "random,0.25,9,abc\n",
                                         "line 3: column 'delta_nll' must hold a finite number, not 'abc'"),
    "topn.csv inf": ("topn.csv", lambda text: text.replace("0.3", "inf"),
                     "column 'delta_nll' must hold a finite number, not inf"),
    "topn.csv 1e400": ("topn.csv", lambda text: text.replace("0.3", "1e400"),
                       "column 'delta_nll' must hold a finite number, not inf"),
}


def _write(run, name: str, damage=None) -> None:
    run.write_derived(name, GOOD[name], run.run_id())
    path = run.path / name
    if damage is not None:
        path.write_text(damage(path.read_text()))


@pytest.mark.parametrize("case", list(DAMAGED))
def test_a_damaged_table_is_one_line_naming_file_line_and_command(case, finished_run, capsys):
    name, damage, message = DAMAGED[case]
    _write(finished_run, name, damage)
    before = snapshot(finished_run.path)
    assert main(["report", str(finished_run.path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tl-geometry: error: ") and err.count("\n") == 1, err
    assert str(finished_run.path / name) in err and message in err, err
    assert snapshot(finished_run.path) == before
    with pytest.raises(TLGeometryError, match="rerun tl-geometry"):  # the same refusal in Python
        derived_results(finished_run, tlg.Analysis.load(finished_run.path))


def test_whole_tables_are_read_back(finished_run, capsys):
    for name in GOOD:
        _write(finished_run, name)
    extras, left_out = derived_results(finished_run, tlg.Analysis.load(finished_run.path))
    assert left_out == {} and set(extras) == {"pruning", "scan", "topn", "streaming"}
    assert extras["scan"][0, 1].item() == pytest.approx(0.21) and extras["streaming"].fractions == (0.5,)
    assert main(["report", str(finished_run.path)]) == 0


def test_an_unreadable_derived_manifest_is_said_as_such(finished_run, capsys):
    _write(finished_run, "pruning.csv")
    finished_run.derived_manifest.write_text("[1, 2")
    assert main(["report", str(finished_run.path)]) == 0
    err = capsys.readouterr().err
    assert "left out of the report: pruning.csv (derived.json, which says which analysis it belongs to, is " \
           "unreadable; rerun tl-geometry prune)" in err and "earlier analysis" not in err
