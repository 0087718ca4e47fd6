"""The fused per-layer pass equals the public functions composed (the torch backend)."""

from __future__ import annotations

import pytest
import torch

from tl_geometry.adapters import LayerAttention
from tl_geometry.config import RunConfig
from tl_geometry.layer_measures import RandomDraws, measure_layer

from .inputs import random_attention


def layer(batch=2, heads=4, kv=2, pos=9, d=5, seed=0, lengths=None, dtype=torch.float32):
    pattern, v, key_mask = random_attention(batch, heads, kv, pos, d=d, seed=seed, lengths=lengths, dtype=dtype,
                                            peaked=2.0)
    return LayerAttention(layer=0, pattern=pattern, kv_values=v, key_mask=key_mask, query_mask=key_mask.clone(),
                          has_bos=torch.ones(batch, dtype=torch.bool))


def draws(batch, repeats, seed=0):
    return RandomDraws(torch.randint(-2**63, 2**63 - 1, (batch,), generator=torch.Generator().manual_seed(seed)),
                       repeats)


def assert_same(a, b, atol):
    assert torch.equal(a.query_positions, b.query_positions)
    assert a.per_query.keys() == b.per_query.keys()
    for name in a.per_query:
        torch.testing.assert_close(a.per_query[name], b.per_query[name], atol=atol, rtol=0, equal_nan=True,
                                   msg=name)
    for field in ("per_row", "per_kv"):
        x, y = getattr(a, field), getattr(b, field)
        assert x.keys() == y.keys()
        for name in x:
            torch.testing.assert_close(x[name], y[name], atol=atol, rtol=0, equal_nan=True, msg=name)
    assert torch.equal(a.votes, b.votes) and torch.equal(a.offsets, b.offsets)


CASES = [
    dict(),
    dict(queries="all"),
    dict(queries="all", taxonomy_queries="last"),
    dict(taxonomy_queries="last"),
    dict(n=(4, 1, 2, 2), ranking="contribution"),
    dict(queries="all", exclude_sink=True, n=(3, 1)),
    dict(queries="all", distance="cosine"),
    dict(sink=False),
]


@pytest.mark.parametrize("options", CASES, ids=[str(c) for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_equals_the_public_functions(options, dtype):
    config = RunConfig(**{"n": (1, 2, 3, 5), **options})
    att = layer(lengths=[9, 6], dtype=dtype)
    random = draws(2, 3)
    fused = measure_layer(att, config, random, backend="fused")
    composed = measure_layer(att, config, random, backend="torch")
    assert_same(fused, composed, atol=1e-12 if dtype == torch.float64 else 1e-5)


@pytest.mark.parametrize("backend", ["fused", "torch"])
def test_non_finite_values_at_real_keys_are_refused(backend):
    att = layer(lengths=[9, 6])
    config = RunConfig(n=(1, 2))
    clean = measure_layer(att, config, None, backend=backend)
    att.kv_values[1, 7] = torch.nan  # a pad key of sequence 1: takes no part
    assert_same(measure_layer(att, config, None, backend=backend), clean, atol=0)
    for bad in (torch.nan, torch.inf):
        att.kv_values[0, 3, 1, 0] = bad
        with pytest.raises(ValueError, match="v contains NaN or infinite values"):
            measure_layer(att, config, None, backend=backend)
