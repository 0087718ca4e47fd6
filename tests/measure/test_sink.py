"""Sink diagnostics: loop oracle agreement, hand-computed values, the F_N split by sink."""

from __future__ import annotations

import math

import pytest
import torch

from tl_geometry.measure.metrics import separability
from tl_geometry.measure.sink import f_by_sink, sink_geometry

from ..inputs import random_attention


def _cos(x, y):
    return float(x @ y / (x.norm() * y.norm() + 1e-12))


def oracle_sink(pattern, v, ns, key_mask):
    """Straight from docs/metrics.md#sink with loops (float64, attention ranking, all queries)."""
    batch, heads, n_q, n_k = pattern.shape
    group = heads // v.shape[2]
    out = {"norm_ratio": torch.full((batch, v.shape[2]), math.nan, dtype=torch.float64),
           "sink_cosine": torch.full((batch, v.shape[2]), math.nan, dtype=torch.float64),
           "sink_rank": torch.full((batch, heads, n_q), math.nan, dtype=torch.float64),
           "align_sink": torch.full((batch, heads, n_q, len(ns)), math.nan, dtype=torch.float64),
           "align_current": torch.full((batch, heads, n_q, len(ns)), math.nan, dtype=torch.float64)}
    for b in range(batch):
        real = [j for j in range(n_k) if key_mask[b, j]]
        for kv in range(v.shape[2]):
            others = [v[b, j, kv] for j in real if j > 0]
            out["norm_ratio"][b, kv] = sum(x.norm() for x in others) / len(others) / v[b, 0, kv].norm()
            out["sink_cosine"][b, kv] = sum(_cos(v[b, 0, kv], x) for x in others) / len(others)
        for h in range(heads):
            kv = h // group
            for t in real:
                alpha = [float(pattern[b, h, t, j]) for j in range(t + 1)]
                out["sink_rank"][b, h, t] = sum(a > alpha[0] for a in alpha)
                order = sorted(range(t + 1), key=lambda j: (-alpha[j], j))
                for i, n in enumerate(ns):
                    if n >= t + 1:
                        continue
                    s = sum(alpha[j] * v[b, j, kv] for j in order[:n])
                    out["align_sink"][b, h, t, i] = _cos(s, v[b, 0, kv])
                    out["align_current"][b, h, t, i] = _cos(s, v[b, t, kv])
    return out


@pytest.mark.parametrize("kv,lengths", [(2, None), (1, [7, 4])])
def test_agrees_with_loop_oracle(kv, lengths):
    pattern, v, key_mask = random_attention(2, 4, kv, 7, seed=5, lengths=lengths)
    ns = (1, 2, 3, 5)
    g = sink_geometry(pattern, v, ns, key_mask=key_mask, query_mask=key_mask)
    ref = oracle_sink(pattern, v, ns, key_mask)
    for name, want in ref.items():
        torch.testing.assert_close(getattr(g, name), want, equal_nan=True, atol=1e-9, rtol=1e-9, msg=name)
    torch.testing.assert_close(g.sink_mass, torch.where(key_mask[:, None], pattern[..., 0], torch.nan), equal_nan=True)


def test_hand_example_values():
    # sink half as long as the others and pointing against v_1, orthogonal to v_2
    v = torch.tensor([[1.0, 0], [-2, 0], [0, 2]], dtype=torch.float64)[None, :, None, :]
    pattern = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0.2, 0.3, 0.5]], dtype=torch.float64)[None, None]
    g = sink_geometry(pattern, v, (1, 2), queries="last")
    assert g.norm_ratio.item() == 2.0 and g.sink_cosine.item() == pytest.approx(-0.5)  # 1e-12 guard
    assert g.sink_rank.item() == 2.0  # 0.5 and 0.3 come before 0.2
    assert g.cosine_by_lag[0, 0, 1:].tolist() == pytest.approx([-1.0, 0.0]) and math.isnan(g.cosine_by_lag[0, 0, 0])
    # N=1: s = 0.5·v_2 → aligned with the current token, orthogonal to the sink
    assert g.align_current[0, 0, 0, 0].item() == pytest.approx(1.0)
    assert g.align_sink[0, 0, 0, 0].item() == pytest.approx(0.0)


def test_sink_wins_ties_in_rank():
    pattern = torch.full((1, 1, 3, 3), 1 / 3, dtype=torch.float64).tril()
    pattern = pattern / pattern.sum(-1, keepdim=True)
    v = torch.randn(1, 3, 1, 4, dtype=torch.float64)
    assert (sink_geometry(pattern, v, 1).sink_rank == 0).all()


def test_f_split_by_sink_partitions_the_defined_entries():
    pattern, v, _ = random_attention(2, 4, 2, 9, seed=2, peaked=3.0)
    sep = separability(pattern, v, (1, 2, 4))
    with_sink, without = f_by_sink(sep)
    assert torch.equal(~torch.isnan(with_sink) ^ ~torch.isnan(without), sep.defined)
    assert not (~torch.isnan(with_sink) & ~torch.isnan(without)).any()
    assert torch.equal(~torch.isnan(with_sink), sep.sink_selected)


def test_rows_whose_window_left_the_sink_behind_have_no_sink_statistics():
    pattern, v, mask = random_attention(2, 4, 2, 10, seed=3, window=3)
    geo = sink_geometry(pattern, v, (1, 2), window=3)
    has_sink = torch.arange(10) < 3  # query t sees t − 2 .. t
    assert bool(torch.isnan(geo.sink_mass[..., ~has_sink]).all()) and not bool(torch.isnan(geo.sink_mass[..., has_sink]).any())
    assert bool(torch.isnan(geo.sink_rank[..., ~has_sink]).all())
    assert bool(torch.isnan(geo.align_sink[:, :, ~has_sink]).all())
    assert not bool(torch.isnan(geo.align_current[:, :, 3:, 0]).any())  # the current token is always in view
    sep = separability(pattern, v, (1, 2), window=3)
    assert not bool(sep.sink_selected[:, :, ~has_sink].any())
    selected, unselected = f_by_sink(sep, window=3)
    assert bool(torch.isnan(selected[:, :, ~has_sink]).all() and torch.isnan(unselected[:, :, ~has_sink]).all())
    assert bool((~torch.isnan(unselected[:, :, 2, 1]) | sep.sink_selected[:, :, 2, 1]).all())  # t = 2 still has its sink
