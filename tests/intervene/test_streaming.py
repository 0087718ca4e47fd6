"""Streaming curves: orders, the oracle against single evaluations, resumption, bad input."""

from __future__ import annotations

import pytest
import torch

import tl_geometry as tlg
from tl_geometry.intervene.ablation import ablate_heads, mean_nll
from tl_geometry.intervene.streaming import kv_head_needs, streaming_curve, taxonomy_need
from tl_geometry.label.taxonomy import HeadTaxonomy

from ..tiny import random_tokens, tiny_streamable


@pytest.fixture(scope="module")
def model():
    return tiny_streamable(4, 2, n_layers=2)


@pytest.fixture(scope="module")
def tokens():
    return random_tokens(2, 24, seed=3)


@pytest.fixture(scope="module")
def curve(model, tokens):
    analysis = tlg.analyze(model, tokens, (1, 2, 4), progress=False)
    return streaming_curve(model, tokens, analysis, fractions=(0.25, 0.5, 1.0), window=4, sink=1, seeds=2,
                           progress=False)


def test_every_order_streams_the_same_set_at_fraction_one(curve):
    at_one = {name: curve.mean_curve(name)[-1].item() for name in curve.delta_nll}
    assert len(set(at_one.values())) == 1 and next(iter(at_one.values())) != 0
    assert curve.delta_nll["random"].shape == (2, 3)
    assert curve.area_to_oracle()["oracle"] == 0


def test_the_oracle_is_each_kv_head_streamed_alone(model, tokens, curve):
    baseline = mean_nll(model, tokens, batch_size=4)
    assert curve.baseline_nll == pytest.approx(baseline, rel=1e-12)
    for layer in range(2):
        for kv in range(2):
            heads = [(layer, kv * 2), (layer, kv * 2 + 1)]  # query heads 2kv, 2kv+1 read kv head kv
            with ablate_heads(model, heads, mode="window", window=4, sink=1):
                alone = (mean_nll(model, tokens, batch_size=4) - baseline) / baseline
            assert curve.needs["oracle"][layer, kv].item() == pytest.approx(alone, rel=1e-9, abs=1e-12)
    first = int(curve.orders["oracle"][0])
    assert curve.delta_nll["oracle"][0].item() == pytest.approx(curve.needs["oracle"].flatten()[first].item())
    assert curve.needs["oracle"].flatten()[first] == curve.needs["oracle"].min()


def test_to_dataframe_is_long(curve):
    frame = curve.to_dataframe()
    assert list(frame.columns) == ["order", "seed", "fraction", "kv_heads_streamed", "delta_nll", "window", "sink",
                                   "seq_len", "n_kv_total", "baseline_nll"]
    assert len(frame) == 3 * (len(curve.delta_nll) - 1) + 2 * 3
    assert sorted(frame.kv_heads_streamed.unique().tolist()) == [1, 2, 4]


def test_kv_need_is_the_neediest_query_head():
    per_head = torch.tensor([[0.1, 0.5, 0.25, 0.0], [0.375, 0.375, 0.875, 0.75]])
    assert kv_head_needs(per_head, 2).tolist() == [[0.5, 0.25], [0.375, 0.875]]


def test_taxonomy_need_counts_winners_beyond_the_window():
    votes = torch.tensor([[[2, 3, 5]]])  # current, sink, other
    offsets = torch.zeros(1, 1, 10, dtype=torch.long)
    offsets[0, 0, 1], offsets[0, 0, 4], offsets[0, 0, 7] = 2, 1, 2  # five "other" votes
    taxonomy = HeadTaxonomy.from_votes(votes, offsets)
    assert taxonomy_need(taxonomy, 4).item() == pytest.approx(3 / 10)
    assert taxonomy_need(taxonomy, 8).item() == 0


def test_a_checkpoint_resumes_without_evaluating_again(model, tokens, tmp_path, monkeypatch):
    import tl_geometry.intervene.streaming as streaming

    path = tmp_path / "stream.json"
    kwargs = dict(fractions=(0.5,), window=4, sink=1, orders=("oracle", "random"), seeds=1, progress=False,
                  checkpoint=path)
    first = streaming_curve(model, tokens, **kwargs)
    calls = []
    real = streaming.ReplayedForwards.mean_nll
    monkeypatch.setattr(streaming.ReplayedForwards, "mean_nll", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = streaming_curve(model, tokens, **kwargs)
    assert not calls  # the baseline's forward only
    assert all(torch.equal(first.delta_nll[k], again.delta_nll[k]) for k in first.delta_nll)
    with pytest.raises(tlg.TLGeometryError, match="written by a streaming curve with other settings; delete it"):
        streaming_curve(model, tokens, **{**kwargs, "window": 3})


@pytest.mark.ill_typed
@pytest.mark.parametrize("kwargs, fault", [
    (dict(fractions=(0.0, 0.5)), "fractions must lie in"),
    (dict(fractions=(1.5,)), "fractions must lie in"),
    (dict(orders=("taxonomy", "magic")), "unknown streaming order 'magic'"),
    (dict(window=20, sink=4), "keeps every key"),
    (dict(window=0), "window must"),
    (dict(sink=-1), "sink must"),
    (dict(orders=("taxonomy",)), "needs the analysis"),
])
def test_bad_input_is_one_clear_error(model, tokens, kwargs, fault):
    with pytest.raises(tlg.TLGeometryError, match=fault):
        streaming_curve(model, tokens, **{"window": 4, "sink": 1, "progress": False, **kwargs})


def test_another_models_analysis_is_refused(model, tokens):
    other = HeadTaxonomy.from_votes(torch.zeros(3, 4, 3, dtype=torch.long), torch.zeros(3, 4, 8, dtype=torch.long),
                                    {"model": "other"})
    with pytest.raises(tlg.TLGeometryError, match="analysis of this model"):
        streaming_curve(model, tokens, other, window=4, sink=1, orders=("taxonomy",), progress=False)


def test_the_table_gives_the_curves_back(curve):
    from tl_geometry.intervene.streaming import StreamingCurve

    again = StreamingCurve.from_dataframe(curve.to_dataframe())
    assert again.fractions == curve.fractions and again.settings["window"] == 4
    assert all(torch.equal(again.delta_nll[k], curve.delta_nll[k]) for k in curve.delta_nll)
    assert again.area_to_oracle() == curve.area_to_oracle()
