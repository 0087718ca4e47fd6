"""Regime fit and the sink-aware bounds: certificates on inputs that satisfy the assumptions."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_geometry.metrics import separability
from tl_geometry.regime import fit_regime, regime_envelope, sink_aware_bounds

from .inputs import random_attention


def regime_inputs(seed, pos, d, heads, c, c0, beta, temperature, sink_bias, shared=0.3):
    """Values in the regime exactly: non-sink norm c around a shared direction e (weight
    `shared`, which sets the coherence), a sink of norm c0 < c with cos(v_0, e) = beta (the signed
    alignment); causal attention rows of any sharpness, with extra logit `sink_bias` on the sink."""
    g = torch.Generator().manual_seed(seed)

    def unit(x):
        return x / x.norm(dim=-1, keepdim=True)

    noise = unit(torch.randn(1, pos, 1, d, generator=g, dtype=torch.float64))
    e = unit(torch.randn(d, generator=g, dtype=torch.float64))
    noise = unit(noise - (noise @ e)[..., None] * e)  # orthogonal to e
    units = unit(shared * e + (1 - shared**2) ** 0.5 * noise)
    sink = unit(beta * e + (1 - beta**2) ** 0.5 * noise[:, :1])
    v = torch.cat([c0 * sink, c * units[:, 1:]], 1)
    logits = torch.randn(1, heads, pos, pos, generator=g, dtype=torch.float64) * temperature
    logits[..., 0] += sink_bias
    causal = torch.ones(pos, pos, dtype=torch.bool).tril()
    return logits.masked_fill(~causal, -torch.inf).softmax(-1), v


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 100_000), pos=st.integers(2, 12), d=st.sampled_from([2, 4, 16, 64, 256]),
       heads=st.sampled_from([1, 3]), c=st.floats(0.5, 4.0), ratio=st.floats(0.05, 0.99),
       beta=st.floats(-1.0, 1.0), temperature=st.floats(0.0, 12.0), sink_bias=st.floats(-3.0, 6.0),
       shared=st.floats(0.0, 0.95), ranking=st.sampled_from(["attention", "contribution", "random"]))
def test_bounds_are_certificates(seed, pos, d, heads, c, ratio, beta, temperature, sink_bias, shared, ranking):
    pattern, v = regime_inputs(seed, pos, d, heads, c, c * ratio, beta, temperature, sink_bias, shared)
    if ranking == "random":
        ranking = torch.rand(pattern.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    ns = (1, 2, 3, 4, 6, 8)
    sep = separability(pattern, v, ns, ranking=ranking)
    bound = sink_aware_bounds(pattern, v, ns, ranking=ranking)
    assert torch.equal(torch.isnan(bound.precision), torch.isnan(sep.precision))
    defined = sep.defined
    assert (bound.precision[defined] <= sep.precision[defined]).all()
    assert (bound.recall[defined] <= sep.recall[defined]).all()


def test_orthogonal_values_are_certified_perfect():
    # coherence 0 and a sink orthogonal to everything: the bound proves P = R = 1 (Theorem 1)
    pos = 8
    v = (torch.eye(pos, dtype=torch.float64) * torch.tensor([0.3] + [2.0] * (pos - 1), dtype=torch.float64))[None, :, None]
    pattern, _, _ = random_attention(1, 4, 1, pos, seed=1, peaked=2.0)
    bound = sink_aware_bounds(pattern, v, (1, 2, 3, 5))
    sep = separability(pattern, v, (1, 2, 3, 5))
    assert torch.equal(bound.precision[sep.defined], torch.ones_like(sep.precision[sep.defined]))
    assert torch.equal(bound.recall[sep.defined], torch.ones_like(sep.recall[sep.defined]))


def test_bound_is_informative_in_high_dimension():
    # low coherence (d = 4096) and attention not too skewed: the bound beats the trivial
    # N / (t + 1) (every unselected source inside the ball) on most queries
    ns = (2, 3, 4)
    t = torch.arange(10, dtype=torch.float64)[None, None, :, None]
    trivial = torch.tensor(ns, dtype=torch.float64) / (t + 1)
    for seed in range(3):
        pattern, v = regime_inputs(seed, 10, 4096, 4, 1.0, 0.3, -0.5, 0.5, 0.0, 0.0)
        bound = sink_aware_bounds(pattern, v, ns)
        defined = ~torch.isnan(bound.precision)
        assert (bound.precision[defined] >= trivial.expand_as(defined)[defined] - 1e-12).all()
        better = (bound.precision > trivial + 1e-9) & defined
        assert better.sum() / defined.sum() > 0.6
        assert (bound.recall[defined] > 0).float().mean() > 0.6


def test_small_n_prediction_with_decaying_attention():
    # Corollary 2: with attention halving from source to source, the certificate is perfect at
    # N ≤ 2 and says nothing beyond the trivial value at larger N
    pos, d = 12, 1024
    weights = 0.5 ** torch.arange(pos, dtype=torch.float64)
    pattern = torch.eye(pos, dtype=torch.float64)[None, None].clone()
    pattern[0, 0, -1] = weights.flip(0) / weights.sum()
    _, v = regime_inputs(0, pos, d, 1, 1.0, 0.2, -0.5, 0.0, 0.0)
    ns = (2, 4, 8)
    bound = sink_aware_bounds(pattern, v, ns, queries="last")
    excess = bound.precision.flatten() - torch.tensor(ns, dtype=torch.float64) / pos
    assert excess[0] > 0.8 and excess[1:].abs().max() < 1e-12
    assert bound.recall.flatten().tolist() == [1.0, 0.25, 0.125]


def test_fit_regime_recovers_the_parameters():
    pattern, v = regime_inputs(0, 40, 64, 1, 2.5, 0.5, -1.0, 1.0, 0.0)
    fit = fit_regime(v)
    assert fit.c.item() == torch.tensor(2.5, dtype=torch.float64).item() or abs(fit.c.item() - 2.5) < 1e-12
    assert fit.c_spread.item() < 1e-12 and abs(fit.c0.item() - 0.5) < 1e-12
    assert fit.sink_alignment.item() < 0 and fit.holds().all()
    assert 0 < fit.coherence_mean.item() <= fit.coherence_max.item() <= 1
    units = v[0, 1:, 0] / v[0, 1:, 0].norm(dim=-1, keepdim=True)
    cos = (units @ units.T).abs().fill_diagonal_(0)
    assert abs(fit.coherence_max.item() - cos.max().item()) < 1e-12
    assert abs(fit.coherence_mean.item() - cos.sum().item() / (39 * 38)) < 1e-12


def test_fit_regime_flags_a_head_outside_the_regime():
    _, v, _ = random_attention(1, 1, 1, 30, d=16, seed=4)  # Gaussian values: norms vary widely
    v[:, 0] *= 10  # a large sink
    fit = fit_regime(v)
    assert not fit.holds().any()


def test_envelope_is_prefix_tight():
    _, v, key_mask = random_attention(2, 1, 1, 9, d=5, seed=8, lengths=[9, 6])
    env = regime_envelope(v.permute(0, 2, 1, 3), key_mask)
    for b, length in enumerate((9, 6)):
        for t in range(2, length):
            x = v[b, 1:t + 1, 0]
            norms = x.norm(dim=-1)
            assert env["c_lo"][b, 0, t] == norms.min() and env["c_hi"][b, 0, t] == norms.max()
            unit = x / (norms[:, None] + 1e-12)
            cos = (unit @ unit.T).abs().fill_diagonal_(0)
            assert math.isclose(env["mu"][b, 0, t].item(), cos.max().item(), rel_tol=1e-12)
