"""Model-level separability: agreement with per-layer metrics, batching/sharding invariance, I/O."""

from __future__ import annotations

import pytest
import torch

from tl_geometry.capture.cache import read_layer
from tl_geometry.measure.layer_measures import RandomDraws
from tl_geometry.measure.metrics import separability
from tl_geometry.measure.sink import f_by_sink, sink_geometry
from tl_geometry.run.analysis import analyze
from tl_geometry.run.geometry import (
    SINK_HEAD_METRICS,
    SINK_N_METRICS,
    GeometryResult,
    bootstrap_ci,
    window_key,
)

from ..tiny import random_tokens, tiny_model

NS = (1, 2, 4)


@pytest.fixture(scope="module")
def model():
    return tiny_model(4, 2)


def test_result_equals_metrics_on_the_cache(model):
    tokens = random_tokens(3, 10, seed=5)
    res = analyze(model, tokens, NS, queries="all", repeats=2, progress=False).geometry
    _, cache = model.run_with_cache(tokens)
    for layer in range(model.cfg.n_layers):
        att = read_layer(cache, layer)
        top = separability(att.pattern, att.v, NS, queries="all")
        torch.testing.assert_close(res.per_sequence["f_top"][:, layer], top.f.nanmean(2).float())
        # two random rankings per query, keyed by (seed 0, window, layer) whatever the batch
        draws = RandomDraws(torch.tensor([window_key(0, b, layer) for b in range(3)]), 2)
        qpos = torch.arange(10).expand(3, 10)
        scores = draws.scores(att.key_mask, qpos, att.query_mask, 4, max(NS), False)
        random = torch.stack([separability(att.pattern, att.v, NS, ranking=scores[r]).f for r in range(2)]).nanmean(0)
        torch.testing.assert_close(res.per_sequence["f_random"][:, layer], random.nanmean(2).float())
    assert res.mean("gap").shape == (3, 4, 3)


def test_batching_and_sharding_do_not_change_the_result(model):
    tokens = random_tokens(5, 9, seed=6)
    whole = analyze(model, tokens, NS, repeats=3, batch_size=5, progress=False).geometry
    ones = analyze(model, tokens, NS, repeats=3, batch_size=1, progress=False).geometry
    first = analyze(model, tokens[:2], NS, repeats=3, progress=False, window_ids=torch.tensor([0, 1])).geometry
    rest = analyze(model, tokens[2:], NS, repeats=3, progress=False, window_ids=torch.tensor([2, 3, 4])).geometry
    merged = rest.merge(first)  # any order
    for other in (ones, merged):
        assert torch.equal(other.window_ids, whole.window_ids)
        for key, value in whole.per_sequence.items():
            torch.testing.assert_close(other.per_sequence[key], value, equal_nan=True, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="share windows"):
        first.merge(first)


def test_euclidean_n1_top_and_random_are_one(model):
    res = analyze(model, random_tokens(2, 8), NS, repeats=2, progress=False).geometry
    assert (res.mean("f_top")[..., 0] == 1).all() and (res.mean("f_random")[..., 0] == 1).all()
    assert (res.mean("gap")[..., 0] == 0).all()


def test_save_load_roundtrip_and_dataframe(model, tmp_path):
    res = analyze(model, random_tokens(2, 8), NS, repeats=1, progress=False, bootstrap=50).geometry
    path = tmp_path / "geometry.safetensors"
    res.save(path)
    back = GeometryResult.load(path)
    assert back.n == res.n and back.settings == res.settings
    for key in res.per_sequence:
        assert torch.equal(back.per_sequence[key].nan_to_num(-1), res.per_sequence[key].nan_to_num(-1))
    frame = res.to_dataframe(with_ci=True)
    assert {"layer", "head", "name", "metric", "n", "value", "ci_low", "ci_high"} <= set(frame.columns)
    n_metrics = 7 + len(SINK_N_METRICS)  # P/R/F top and random, gap, sink metrics by N
    assert len(frame) == 3 * 4 * (3 * n_metrics + len(SINK_HEAD_METRICS)) and frame["name"].iloc[5] == "L0H1"
    assert (path.read_bytes()[:8] != b"\x80\x04")  # not a pickle


def test_sink_values_agree_with_the_layer_functions_and_certify(model):
    tokens = random_tokens(3, 10)
    res = analyze(model, tokens, NS, repeats=0, progress=False, bootstrap=20).geometry
    layer = 1
    cache = model.run_with_cache(tokens)[1]
    att = read_layer(cache, layer)
    top = separability(att.pattern, att.v, NS, queries="last", key_mask=att.key_mask, query_mask=att.query_mask)
    with_sink, _ = f_by_sink(top)
    torch.testing.assert_close(res.per_sequence["f_sink_selected"][:, layer], with_sink.nanmean(2).float(),
                               equal_nan=True)
    geo = sink_geometry(att.pattern, att.v, NS, queries="last")
    torch.testing.assert_close(res.per_sequence["norm_ratio"][:, layer], geo.norm_ratio.float())
    # certificates hold query by query, hence for sequence means over the same queries
    measured_p, measured_r = res.per_sequence["precision_top"], res.per_sequence["recall_top"]
    for name, measured in (("precision_bound", measured_p), ("recall_bound", measured_r),
                           ("precision_certificate", measured_p), ("recall_certificate", measured_r)):
        bound = res.per_sequence[name]
        assert torch.equal(torch.isnan(bound), torch.isnan(measured))
        assert (bound.nan_to_num(0) <= measured.nan_to_num(0) + 1e-6).all(), name
    assert res.has_sink and res.mean("cosine_by_lag").shape == (model.cfg.n_layers, model.cfg.n_heads, 10)


def test_bootstrap_ci_brackets_the_mean_and_collapses_on_constants():
    values = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))
    bounds = bootstrap_ci(values, replicates=500)
    mean = values.mean(0)
    assert ((bounds[:, 0] <= mean) & (mean <= bounds[:, 1])).all()
    const = bootstrap_ci(torch.full((10, 2), 0.25), replicates=100)
    torch.testing.assert_close(const, torch.full((2, 2), 0.25))
    with_nan = torch.tensor([[1.0], [float("nan")], [3.0]])
    assert torch.isfinite(bootstrap_ci(with_nan, replicates=200)).all()


def test_empty_corpus_is_an_error(model):
    with pytest.raises(ValueError, match="at least one window"):
        analyze(model, torch.zeros(0, 5, dtype=torch.long), NS, progress=False)


@pytest.mark.slow
def test_real_smollm2_separability(smollm2):
    tokens = smollm2.to_tokens(["The history of the city begins with a small fishing village on the river.",
                                "Photosynthesis converts light energy into chemical energy stored in sugar."])
    res = analyze(smollm2, tokens[:, :12], (1, 2, 4), repeats=4, progress=False).geometry
    assert res.mean("f_top").shape == (30, 9, 3)
    assert (res.mean("f_top")[..., 0] == 1).all()
    assert torch.isfinite(res.mean("gap")).all()


def test_analyze_runs_on_every_model_class(tiny_model):
    """HookedTransformer (legacy venv) and TransformerBridge, GQA/MQA/MHA, with right padding."""
    tokens = random_tokens(3, 9, seed=8)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[2, 6:] = 0
    res = analyze(tiny_model, tokens, NS, attention_mask=mask, queries="all", repeats=2, progress=False).geometry
    assert res.mean("f_top").shape == (3, 4, 3)
    assert (res.mean("f_top")[..., 0] == 1).all() and res.settings["model_class"] in ("HookedTransformer", "TransformerBridge")
    alone = analyze(tiny_model, tokens[2:, :6], NS, queries="all", repeats=2, progress=False,
                                 window_ids=torch.tensor([2])).geometry
    for key, value in alone.per_sequence.items():
        padded = res.per_sequence[key][2:]
        if key == "cosine_by_lag":  # by position: pads are NaN
            assert torch.isnan(padded[..., 6:]).all()
            padded = padded[..., :6]
        torch.testing.assert_close(padded, value, equal_nan=True, atol=1e-6, rtol=0)
