"""The regime fit (measure/regime.py): the parameters recovered on inputs in the regime, a head outside it flagged, the prefix envelope."""

from __future__ import annotations

import math

import torch

from tl_geometry.measure.regime import fit_regime, regime_envelope

from ..inputs import random_attention, regime_inputs


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


