"""The one-pass notebook entry point: equals the separate passes, texts in, save/load, tables."""

from __future__ import annotations

import torch

import tl_geometry as tlg
from tl_geometry.taxonomy import vote_counts

from .tiny import random_tokens, tiny_bridge


def test_one_pass_equals_separate_passes_and_per_layer_votes(tmp_path):
    model = tiny_bridge(4, 2)
    tokens = random_tokens(5, 9, seed=2)
    res = tlg.analyze(model, tokens, (1, 2, 4), repeats=2, batch_size=2, progress=False, bootstrap=20)
    alone = tlg.analyze_separability(model, tokens, (1, 2, 4), repeats=2, batch_size=5, progress=False, bootstrap=20)
    for key, value in alone.per_sequence.items():
        torch.testing.assert_close(res.geometry.per_sequence[key], value, equal_nan=True, atol=1e-6, rtol=0)
    tax = tlg.classify_heads(model, tokens, batch_size=3, progress=False)
    assert torch.equal(tax.votes, res.taxonomy.votes) and torch.equal(tax.offsets, res.taxonomy.offsets)
    _, cache = model.run_with_cache(tokens)
    att = tlg.read_layer(cache, 2)
    assert torch.equal(res.taxonomy.votes[2], vote_counts(att.pattern, att.v).sum(0))
    table = res.heads_table()
    assert len(table) == 3 * 4 and table["name"].iloc[5] == "L1H1"
    assert set(table["regime"]) <= {"retriever", "mixer", "reset"}
    assert res.regime_means("align_sink").shape[1] == 3
    res.save(tmp_path / "run")
    back = tlg.Analysis.load(tmp_path / "run")
    assert torch.equal(back.taxonomy.votes, res.taxonomy.votes) and back.geometry.n == res.geometry.n


def test_texts_are_tokenised_with_bos_and_right_padding(smollm2):
    texts = ["The cat sat on the mat.", "Paris is the capital of France, a country in Europe."]
    tokens, mask = tlg.tokenize_texts(smollm2, texts)
    assert (tokens[:, 0] == smollm2.tokenizer.bos_token_id).all() and mask[0].sum() < mask[1].sum()
    res = tlg.analyze(smollm2, texts, (1, 2, 4), repeats=2, progress=False, bootstrap=20)
    assert res.taxonomy.labels.shape == (30, 9) and res.geometry.settings["n_windows"] == 2
    n_votes = (mask[:, 1:].sum()).item()  # every real query but position 0, per head
    assert (res.taxonomy.votes.sum(-1) == n_votes).all()


_KILLED_RUN = """
import time, torch, tl_geometry as tlg
import tl_geometry.analysis as analysis_module
from tests.tiny import tiny_bridge, random_tokens
real = analysis_module.stream_layers
def slow(*args, **kwargs):
    time.sleep(0.4)  # slow batches, so that the parent can kill the run in the middle
    return real(*args, **kwargs)
analysis_module.stream_layers = slow
tlg.analyze(tiny_bridge(4, 2), random_tokens(8, 10, seed=9), (1, 2, 4), repeats=2, batch_size=2, progress=False,
            bootstrap=20, checkpoint={path!r})
"""


def test_sigkilled_run_resumes_from_its_last_checkpoint(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    path = tmp_path / "checkpoint.safetensors"
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_RUN.format(path=str(path))], cwd=root)
    deadline = time.time() + 120
    while not path.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert path.exists(), "the run never wrote a checkpoint"
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        done = fh.get_tensor("window_ids").numel()
    assert 2 <= done < 8  # killed mid-run: at most the batch in flight is lost
    model, tokens = tiny_bridge(4, 2), random_tokens(8, 10, seed=9)
    options = {"repeats": 2, "batch_size": 2, "progress": False, "bootstrap": 20}
    resumed = tlg.analyze(model, tokens, (1, 2, 4), checkpoint=path, **options)
    whole = tlg.analyze(model, tokens, (1, 2, 4), **options)
    for key, value in whole.geometry.per_sequence.items():
        assert torch.equal(resumed.geometry.per_sequence[key].nan_to_num(-9), value.nan_to_num(-9)), key
    assert torch.equal(resumed.taxonomy.votes, whole.taxonomy.votes)
    other = dict(options, repeats=3)
    try:
        tlg.analyze(model, tokens, (1, 2, 4), checkpoint=path, **other)
    except ValueError as exc:
        assert "other settings" in str(exc)
    else:
        raise AssertionError("a checkpoint of other settings was accepted")
