"""Pruning curves, the single-head scan and top-N deletion: invariants and agreement with ablate_heads."""

from __future__ import annotations

import pytest
import torch

import tl_geometry as tlg
from tl_geometry.intervene.ablation import ablate_heads, mean_nll
from tl_geometry.intervene.importance import head_importance
from tl_geometry.intervene.pruning import heads_to_remove, pruning_curve, single_head_scan, topn_deletion

from ..tiny import random_tokens


def test_pruning_curve_is_zero_at_full_retention_and_matches_ablation(tiny_model):
    tokens = random_tokens(4, 8, seed=2)
    importance = {"random": head_importance(tiny_model, method="random", seed=1),
                  "magnitude": head_importance(tiny_model, method="magnitude")}
    curve = pruning_curve(tiny_model, tokens, importance, (1.0, 0.5), progress=False, batch_size=3)
    assert (curve[curve.retention == 1.0]["delta_nll"] == 0).all()
    row = curve[(curve.method == "random") & (curve.retention == 0.5)].iloc[0]
    heads = heads_to_remove(importance["random"], 0.5)
    with ablate_heads(tiny_model, heads):
        nll = mean_nll(tiny_model, tokens)
    assert row.heads_removed == len(heads) == 6
    assert row.delta_nll == pytest.approx((nll - row.baseline_nll) / row.baseline_nll, rel=1e-5)  # batch composition changes float rounding


def test_single_head_scan_agrees_with_ablate_heads_and_resumes(tiny_model, tmp_path):
    tokens = random_tokens(3, 7, seed=3)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[2, 5:] = 0
    path = tmp_path / "scan.json"
    scan = single_head_scan(tiny_model, tokens, attention_mask=mask, batch_size=5, checkpoint=path, progress=False)
    baseline = mean_nll(tiny_model, tokens, attention_mask=mask)
    for layer, head in [(0, 0), (1, 3), (2, 1)]:
        with ablate_heads(tiny_model, [(layer, head)]):
            expected = (mean_nll(tiny_model, tokens, attention_mask=mask) - baseline) / baseline
        assert scan[layer, head].item() == pytest.approx(expected, rel=1e-4, abs=1e-7)
    assert torch.equal(single_head_scan(tiny_model, tokens, attention_mask=mask, checkpoint=path, progress=False), scan)
    with pytest.raises(tlg.TLGeometryError, match="written by a single-head scan with other settings"):
        single_head_scan(tiny_model, tokens[:2], checkpoint=path, progress=False)


def test_topn_deletion_beyond_sequence_length_changes_nothing(tiny_model):
    tokens = random_tokens(2, 6, seed=5)
    try:
        res = topn_deletion(tiny_model, tokens, (1, 6, 50), progress=False)
    except tlg.TLGeometryError as exc:  # the 3.x bridge reports its pattern after using it
        assert "before it reports hook_pattern" in str(exc)
        pytest.skip("this model class cannot override attention patterns (TransformerLens 3.x bridge)")
    assert res.delta_nll[1:].abs().max() == 0 and res.delta_nll[0] != 0
    # the smallest N whose ΔNLL is within τ: N = 6 keeps every source of 6-token windows (ΔNLL 0)
    for tau, smallest in res.smallest_n.items():
        assert smallest == (1 if res.delta_nll[0] <= tau else 6)
    renorm = topn_deletion(tiny_model, tokens, (1,), renormalise=True, progress=False)
    assert renorm.delta_nll[0] != res.delta_nll[0]
    with pytest.warns(DeprecationWarning, match="now n="):  # the former keyword, for one release
        old = topn_deletion(tiny_model, tokens, n_values=(1, 6, 50), progress=False)
    assert torch.equal(old.delta_nll, res.delta_nll)
