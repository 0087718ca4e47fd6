"""The numba per-layer pass equals the public functions composed (the torch backend)."""

from __future__ import annotations

import pytest
import torch

from tl_geometry.capture.adapters import LayerAttention
from tl_geometry.config import RunConfig
from tl_geometry.measure.layer_measures import RandomDraws, measure_layer

from ..inputs import random_attention


def layer(batch=2, heads=4, kv=2, pos=9, d=5, seed=0, lengths=None, dtype=torch.float32, window=None):
    pattern, v, key_mask = random_attention(batch, heads, kv, pos, d=d, seed=seed, lengths=lengths, dtype=dtype,
                                            peaked=2.0, window=window)
    return LayerAttention(layer=0, pattern=pattern, kv_values=v, key_mask=key_mask, query_mask=key_mask.clone(),
                          has_bos=torch.ones(batch, dtype=torch.bool), window=window)


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
    assert torch.equal(a.sinkless_votes, b.sinkless_votes)


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


@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("options", CASES, ids=[str(c) for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_numba_equals_the_public_functions(options, dtype, window):
    config = RunConfig(**{"n": (1, 2, 3, 5), **options})
    att = layer(lengths=[9, 6], dtype=dtype, window=window)
    random = draws(2, 3)
    compiled = measure_layer(att, config, random, backend="numba")
    composed = measure_layer(att, config, random, backend="torch")
    assert_same(compiled, composed, atol=1e-12 if dtype == torch.float64 else 1e-5)


@pytest.mark.parametrize("backend", ["numba", "torch"])
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_numba_winners_equal_the_loop_oracle_with_ties_and_signed_zeros(dtype):
    """The numba pass finds each row's winner as an integer maximum over 16-key blocks: ties
    (several keys, in and across blocks) go to the lower position, -0.0 weighs as 0, and keys
    with zero values score 0 (exact multiples, so every tie is exact)."""
    from .test_votes import oracle_winners

    pos, batch, heads = 53, 2, 2
    g = torch.Generator().manual_seed(3)
    weights = torch.randint(0, 3, (batch, heads, pos, pos), generator=g).to(dtype).tril()
    weights[..., 0] = 1  # every row has mass
    pattern = weights / weights.sum(-1, keepdim=True)
    pattern = torch.where((pattern == 0) & (torch.rand(pattern.shape, generator=g) < 0.5), -0.0, pattern)
    pattern = pattern.tril()  # future keys +0: only keys 0..t are read
    v = torch.zeros(batch, pos, 1, 4, dtype=dtype)
    v[..., 0] = 2.0  # equal norms: the weights decide, with exact ties
    v[:, 7::5] = 0.0  # zero values: score 0 whatever the weight
    key_mask = torch.ones(batch, pos, dtype=torch.bool)
    key_mask[1, 40:] = False
    att = LayerAttention(layer=0, pattern=pattern.masked_fill(~key_mask[:, None, None, :], 0.0), kv_values=v,
                         key_mask=key_mask, query_mask=key_mask.clone(), has_bos=torch.ones(batch, dtype=torch.bool))
    att = LayerAttention(layer=0, pattern=att.pattern / att.pattern.sum(-1, keepdim=True), kv_values=v,
                         key_mask=key_mask, query_mask=key_mask.clone(), has_bos=att.has_bos)
    compiled = measure_layer(att, RunConfig(n=(1,), sink=False), None, backend="numba")
    winners = oracle_winners(att.pattern, v, key_mask)
    votes = torch.zeros(batch, heads, 3, dtype=torch.int64)
    offsets = torch.zeros(batch, heads, pos, dtype=torch.int64)
    for b, h, t in torch.nonzero(winners >= 0).tolist():
        w = int(winners[b, h, t])
        votes[b, h, 0 if w == t else 1 if w == 0 else 2] += 1
        offsets[b, h, t - w] += 0 if w in (0, t) else 1
    assert torch.equal(compiled.votes, votes) and torch.equal(compiled.offsets, offsets)
    scores = att.pattern * v.norm(dim=-1)[:, None, None, :, 0]
    top = scores.max(-1, keepdim=True).values
    assert ((scores == top).sum(-1) > 1).sum() > 100  # many rows with ties to break


def test_a_workspace_reused_across_layers_of_other_shapes_changes_nothing():
    from tl_geometry.measure.layer_measures import Workspace

    config = RunConfig(n=(1, 2, 3))
    small, large = layer(pos=9, lengths=[9, 6]), layer(batch=3, pos=14, seed=2)
    workspace = Workspace()
    for att in (small, large, small):  # the buffer grows for the larger layer, then is reused smaller
        assert_same(measure_layer(att, config, draws(att.pattern.shape[0], 2), backend="numba", workspace=workspace),
                    measure_layer(att, config, draws(att.pattern.shape[0], 2), backend="numba"), atol=0)
    assert workspace._buffers["gram"].numel() == 3 * 2 * 14 * 14


BAD_PATTERNS = {
    "nan": ("NaN or infinite values in real query rows", lambda p: p.index_put_((torch.tensor(0), torch.tensor(1), torch.tensor(5), torch.tensor(2)), torch.tensor(torch.nan))),
    "negative": ("negative entries", lambda p: p[0, 1, 7, :2].copy_(torch.tensor([-0.25, 1.25]) * p[0, 1, 7, :2].sum())),
    "scores": ("do not sum to 1", lambda p: p.mul_(1.2)),
    "one row": ("do not sum to 1", lambda p: p[1, 0, 3].mul_(0.9)),
}


@pytest.mark.parametrize("queries", ["last", "all"])
@pytest.mark.parametrize("fault", list(BAD_PATTERNS))
def test_bad_patterns_are_refused_by_the_numba_pass_as_by_the_torch_backend(fault, queries):
    message, spoil = BAD_PATTERNS[fault]
    att = layer(lengths=[9, 6])
    spoil(att.pattern)
    for backend in ("numba", "torch"):
        with pytest.raises(ValueError, match=message):
            measure_layer(att, RunConfig(n=(1, 2), queries=queries), None, backend=backend)


def test_garbage_in_pad_query_rows_is_not_a_fault():
    att = layer(lengths=[9, 6])
    clean = measure_layer(att, RunConfig(n=(1, 2), queries="all"), None, backend="numba")
    att.pattern[1, :, 7] = -3.0  # a pad query of sequence 1: no row check, no measure
    assert_same(measure_layer(att, RunConfig(n=(1, 2), queries="all"), None, backend="numba"), clean, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_narrow_dtype_rows_pass_the_numba_checks(dtype):
    att = layer(pos=40, dtype=torch.float32)
    att = LayerAttention(layer=0, pattern=att.pattern.to(dtype), kv_values=att.kv_values.to(dtype),
                         key_mask=att.key_mask, query_mask=att.query_mask, has_bos=att.has_bos)
    assert float((att.pattern.double().sum(-1) - 1).abs().max()) > 1e-4  # off by more than float32 would be
    out = measure_layer(att, RunConfig(n=(1, 2), queries="all"), None, backend="numba")
    assert out.per_query["f_top"].isfinite().any()
