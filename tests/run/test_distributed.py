"""Sharded runs: any split and order of windows merges into the single-process result; two gloo
processes give the single-process result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

import tl_geometry as tlg

from ..tiny import random_tokens, tiny_model

NS = (1, 2, 4)


def _assert_same(a: tlg.Analysis, b: tlg.Analysis, atol: float = 0.0) -> None:
    assert torch.equal(a.geometry.window_ids, b.geometry.window_ids)
    assert a.geometry.per_sequence.keys() == b.geometry.per_sequence.keys()
    for key, value in a.geometry.per_sequence.items():
        torch.testing.assert_close(value, b.geometry.per_sequence[key], equal_nan=True, atol=atol, rtol=0, msg=key)
    assert torch.equal(a.taxonomy.votes, b.taxonomy.votes) and torch.equal(a.taxonomy.offsets, b.taxonomy.offsets)


def test_any_split_in_any_order_merges_to_the_whole_run():
    model = tiny_model(4, 2)
    tokens = random_tokens(7, 10, seed=6)
    whole = tlg.analyze(model, tokens, NS, repeats=3, batch_size=1, progress=False, bootstrap=20)
    parts = [[4, 0, 6], [2], [5, 1, 3]]
    shards = [tlg.analyze(model, tokens[idx], NS, repeats=3, batch_size=1, progress=False, bootstrap=20,
                          window_ids=torch.tensor(idx)) for idx in parts]
    merged = shards[2].merge(shards[0]).merge(shards[1])
    _assert_same(merged, whole)
    assert merged.geometry.settings["n_windows"] == 7
    assert merged.geometry.summary().equals(whole.geometry.summary())  # bootstrap seeded per run, not per shard


def _worker(rank: int, world_size: int, init_file: str, out: str, n_windows: int = 5) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    model = tiny_model(4, 2)
    res = tlg.analyze(model, random_tokens(n_windows, 10, seed=6), NS, repeats=3, batch_size=1, progress=False,
                      bootstrap=20)
    if rank == 0:
        res.save(out)
    dist.destroy_process_group()


def test_two_gloo_processes_equal_one(tmp_path):
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(tmp_path / "run")), nprocs=2, join=True)
    sharded = tlg.Analysis.load(tmp_path / "run")
    whole = tlg.analyze(tiny_model(4, 2), random_tokens(5, 10, seed=6), NS, repeats=3, batch_size=1, progress=False,
                        bootstrap=20)
    _assert_same(sharded, whole, atol=1e-6)  # another process may order float sums differently; votes exact
    assert sharded.geometry.settings["world_size"] == 2 and sharded.geometry.settings["n_windows"] == 5


def test_more_ranks_than_windows_leave_a_shard_empty(tmp_path):
    mp.spawn(_worker, args=(3, str(tmp_path / "init"), str(tmp_path / "run"), 2), nprocs=3, join=True)
    sharded = tlg.Analysis.load(tmp_path / "run")
    whole = tlg.analyze(tiny_model(4, 2), random_tokens(2, 10, seed=6), NS, repeats=3, batch_size=1, progress=False,
                        bootstrap=20)
    _assert_same(sharded, whole, atol=1e-6)
    assert sharded.geometry.settings["world_size"] == 3 and sharded.geometry.window_ids.tolist() == [0, 1]


@pytest.mark.slow
def test_cli_under_torchrun_equals_one_process(smollm2, tmp_path):
    import pandas as pd

    torchrun = Path(sys.executable).with_name("torchrun")
    # torchrun reads "--n" as an abbreviation of its own options: the long spelling passes through
    args = ["analyze", "--windows", "4", "--seq-len", "24", "--n-values", "1,2", "--repeats", "2", "--batch-size", "1", "--quiet"]
    cli = str(Path(sys.executable).with_name("tl-geometry"))
    single = subprocess.run([cli, *args, "--out", str(tmp_path / "one")], capture_output=True, text=True, timeout=600)
    assert single.returncode == 0, single.stderr[-2000:]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run([str(torchrun), "--nproc_per_node", "2", "--master_port", "29533", cli, *args,
                          "--out", str(tmp_path / "two")], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == str((tmp_path / "two" / "report.html").resolve())  # rank 0 only
    one, two = pd.read_csv(tmp_path / "one" / "heads.csv"), pd.read_csv(tmp_path / "two" / "heads.csv")
    pd.testing.assert_frame_equal(one, two, atol=1e-6, rtol=0)
    assert json.loads((tmp_path / "two" / "settings.json").read_text())["world_size"] == 2
    assert not list((tmp_path / "two").glob("checkpoint*"))  # every rank removed its own checkpoint
