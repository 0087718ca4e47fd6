"""Separability metrics: agreement with the loop oracle, docs/metrics.md#separability facts as properties, bad input."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tl_geometry.measure import metrics
from tl_geometry.measure.metrics import inversion_bounds, random_separability, separability

from ..inputs import random_attention
from ..oracle import oracle_separability


def _compare(fast, ref, positions_mask=None):
    for name in ("precision", "recall", "f", "margin", "inversions"):
        got, want = getattr(fast, name), ref[name]
        assert torch.equal(torch.isnan(got), torch.isnan(want)), name
        torch.testing.assert_close(got.nan_to_num(-7), want.nan_to_num(-7), atol=1e-9, rtol=1e-9, msg=name)
    assert torch.equal(fast.sink_selected, ref["sink_selected"].nan_to_num(0).bool())


# The numba CPU kernel and the vectorised torch code implement the same definitions.
BACKENDS = ("numba", "torch")

CASES = [
    # batch, heads, kv, pos, lengths, distance, ranking, queries, exclude_sink
    (2, 4, 2, 9, None, "euclidean", "attention", "all", False),
    (2, 4, 1, 7, [7, 4], "euclidean", "contribution", "all", False),   # MQA, right padding
    (1, 3, 3, 6, None, "cosine", "attention", "all", False),
    (2, 6, 3, 8, [8, 5], "cosine", "contribution", "last", False),
    (2, 4, 2, 9, None, "euclidean", "random", "positions", True),
    (1, 2, 1, 2, None, "euclidean", "attention", "all", False),        # shortest sequence
    (2, 4, 2, 10, [10, 6], "euclidean", "attention", "last", True),
    (1, 4, 4, 12, None, "cosine", "random", "all", True),
]
# Sliding windows shorter than the sequences (the sink leaves the view of the later queries).
WINDOW_CASES = [
    (2, 4, 2, 11, [11, 7], "euclidean", "attention", "all", False, 4),   # GQA, right padding
    (2, 4, 1, 10, None, "euclidean", "contribution", "last", False, 3),
    (1, 3, 3, 12, None, "cosine", "random", "all", True, 5),
    (2, 2, 2, 9, [9, 9], "euclidean", "random", "positions", False, 1),   # a window of one: nothing defined
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("batch,heads,kv,pos,lengths,distance,ranking,queries,exclude_sink,window",
                         [(*case, None) for case in CASES] + WINDOW_CASES)
def test_agrees_with_oracle(batch, heads, kv, pos, lengths, distance, ranking, queries, exclude_sink, window, backend):
    pattern, v, mask = random_attention(batch, heads, kv, pos, seed=pos + heads, lengths=lengths, window=window)
    ns = (1, 2, 3, 5, 8)
    rank_arg = torch.rand(pattern.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64) \
        if ranking == "random" else ranking
    if queries == "positions":
        q_arg = torch.tensor([0, 3, pos - 1])
        positions = [[0, 3, pos - 1]] * batch
    elif queries == "last":
        q_arg, positions = "last", [[int(m.sum()) - 1] for m in mask]
    else:
        q_arg, positions = "all", None
    fast = separability(pattern, v, ns, distance=distance, ranking=rank_arg, queries=q_arg,
                        exclude_sink=exclude_sink, key_mask=mask, query_mask=mask, window=window, backend=backend)
    ref = oracle_separability(pattern, v, ns, distance=distance, ranking=rank_arg, positions=positions,
                              exclude_sink=exclude_sink, key_mask=mask, query_mask=mask, window=window)
    _compare(fast, ref)
    assert fast.query_positions.shape == (batch, len(positions[0]) if positions else pos)


@pytest.mark.parametrize("backend", BACKENDS)
def test_n_in_any_order_with_repeats(backend):
    """Each column holds its own N, whatever the order of n (the nested sets grow in sorted order)."""
    pattern, v, _ = random_attention(2, 4, 2, 12, seed=8)
    ordered = separability(pattern, v, (2, 4, 7), backend=backend)
    shuffled = separability(pattern, v, (7, 2, 4, 2), backend=backend)
    assert shuffled.n == (7, 2, 4, 2)
    for name in ("precision", "recall", "f", "margin", "inversions", "sink_selected"):
        want = getattr(ordered, name)[..., [2, 0, 1, 0]]
        assert torch.equal(getattr(shuffled, name).nan_to_num(-1), want.nan_to_num(-1)), name


@pytest.mark.parametrize("queries", ["all", "last"])
def test_backends_agree_on_float32_model_like_input(queries):
    """Float32 input with GQA, padding and long rows (a random ranking too): the kernel works
    in float64 and the torch code in float32, so only near-exact distance ties may differ."""
    pattern, v, mask = random_attention(3, 6, 2, 40, d=16, seed=21, lengths=[40, 31, 25], peaked=3.0)
    pattern, v = pattern.float(), v.float()
    scores = torch.rand(pattern.shape, generator=torch.Generator().manual_seed(1))
    for ranking in ("attention", "contribution", scores):
        opts = dict(queries=queries, ranking=ranking, key_mask=mask, query_mask=mask)
        a = separability(pattern, v, (1, 2, 4, 8, 16, 32), backend="numba", **opts)
        b = separability(pattern, v, (1, 2, 4, 8, 16, 32), backend="torch", **opts)
        assert torch.equal(a.defined, b.defined)
        same = (a.f - b.f).abs()[a.defined] < 1e-6
        assert same.float().mean() > 0.995
        assert (a.sink_selected == b.sink_selected).float().mean() > 0.995


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_agrees_with_oracle_on_generic_input(backend):
    pattern, v, _ = random_attention(2, 4, 2, 24, seed=11)
    fast = separability(pattern.float(), v.float(), (1, 2, 4, 8, 16), backend=backend)
    ref = oracle_separability(pattern, v, (1, 2, 4, 8, 16))
    agree = (fast.f.double().nan_to_num(-1) - ref["f"].nan_to_num(-1)).abs() < 1e-6
    assert agree.float().mean() > 0.995  # float32 may flip only near-exact distance ties


def test_undefined_entries_are_nan_not_clipped():
    pattern, v, _ = random_attention(1, 2, 1, 5)
    sep = separability(pattern, v, (1, 4, 5, 100))
    # query t has t+1 candidates; N is defined iff N < t+1
    for t in range(5):
        for i, n in enumerate((1, 4, 5, 100)):
            assert bool(sep.defined[0, 0, t, i]) == (n < t + 1)
    assert torch.isnan(sep.f[:, :, 0]).all()  # query 0 has a single source


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_ties_go_to_lower_position(backend):
    pattern = torch.zeros(1, 1, 4, 4, dtype=torch.float64)
    pattern[0, 0] = torch.tensor([[1, 0, 0, 0], [0.5, 0.5, 0, 0], [1 / 3] * 3 + [0], [0.25] * 4], dtype=torch.float64)
    v = torch.randn(1, 4, 1, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for n in (1, 2, 3):
        sep = separability(pattern, v, n, backend=backend)
        ref = oracle_separability(pattern, v, (n,))
        _compare(sep, ref)
        assert bool(sep.sink_selected[0, 0, 3, 0])  # position 0 wins every tie


# ----- docs/metrics.md#separability facts as properties -----------------------------------------------------------

attention_inputs = st.builds(
    lambda seed, pos, heads, kv_div, peaked, dist: (random_attention(1, heads, heads // kv_div, pos, seed=seed, peaked=peaked), dist),
    seed=st.integers(0, 10_000), pos=st.integers(2, 10), heads=st.sampled_from([2, 4]),
    kv_div=st.sampled_from([1, 2]), peaked=st.floats(0.1, 6.0), dist=st.sampled_from(["euclidean", "cosine"]),
)
NS = (1, 2, 3, 4, 6)


@settings(max_examples=40, deadline=None)
@given(attention_inputs)
def test_inversion_certificates_hold(inputs):
    (pattern, v, _), dist = inputs
    sep = separability(pattern, v, NS, distance=dist)
    p_low, r_low = inversion_bounds(sep)
    ok = sep.defined
    assert (sep.precision[ok] >= p_low[ok] - 1e-12).all()
    assert (sep.recall[ok] >= r_low[ok] - 1e-12).all()


@settings(max_examples=40, deadline=None)
@given(attention_inputs)
def test_positive_margin_iff_no_inversion_iff_perfect(inputs):
    (pattern, v, _), dist = inputs
    for backend in BACKENDS:
        sep = separability(pattern, v, NS, distance=dist, backend=backend)
        ok = sep.defined
        margin_pos = sep.margin[ok] > 0
        no_inv = sep.inversions[ok] == 0
        perfect = (sep.precision[ok] == 1) & (sep.recall[ok] == 1) & (sep.f[ok] == 1)
        assert torch.equal(margin_pos, no_inv) and torch.equal(no_inv, perfect)


@settings(max_examples=30, deadline=None)
@given(attention_inputs, st.integers(0, 2**31 - 1))
def test_euclidean_n1_is_perfect_for_any_ranking(inputs, seed):
    (pattern, v, _), _ = inputs
    scores = torch.rand(pattern.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    for ranking in ("attention", "contribution", scores):
        sep = separability(pattern, v, 1, ranking=ranking)
        ok = sep.defined
        assert (sep.precision[ok] == 1).all() and (sep.recall[ok] == 1).all() and (sep.f[ok] == 1).all()


def test_cosine_with_zero_aggregate_has_zero_recall():
    pattern = torch.tensor([[[[1.0, 0, 0], [0.5, 0.5, 0], [0.3, 0.3, 0.4]]]], dtype=torch.float64)
    v = torch.tensor([[1.0, 0], [-1.0, 0], [0.0, 1.0]], dtype=torch.float64).view(1, 3, 1, 2)
    sep = separability(pattern, v, 2, distance="cosine", ranking=torch.tensor([[[[0, 0, 0], [0, 0, 0], [2.0, 1.0, 0]]]]))
    # query 2 selects keys 0 and 1: s_N = 0.3 - 0.3 = 0, every distance is 1
    assert sep.recall[0, 0, 2, 0] == 0 and sep.f[0, 0, 2, 0] == 0


@settings(max_examples=30, deadline=None)
@given(attention_inputs, st.integers(0, 10_000))
def test_permuting_unselected_sources_changes_nothing(inputs, seed):
    """Swapping the values (and weights) of two sources unselected by every head leaves every
    head's P/R/F at that query unchanged."""
    (pattern, v, _), dist = inputs
    n = 2
    t = pattern.shape[2] - 1
    assume(t + 1 > n + 2)
    order = torch.argsort(-pattern[0, :, t], dim=-1, stable=True)  # [head, key], ties to the lower position
    unselected = set(range(t + 1)) - set(order[:, :n].flatten().tolist())
    assume(len(unselected) >= 2)
    # Query heads sharing a kv head see the same values: swap both sources in every head at once.
    pool = sorted(unselected)
    picks = torch.randperm(len(pool), generator=torch.Generator().manual_seed(seed))[:2].tolist()
    i, j = sorted(pool[k] for k in picks)
    p2, v2 = pattern.clone(), v.clone()
    p2[0, :, t, [i, j]] = p2[0, :, t, [j, i]]
    v2[0, [i, j]] = v2[0, [j, i]]
    sep = separability(pattern, v, n, distance=dist, queries="last")
    sep2 = separability(p2, v2, n, distance=dist, queries="last")
    for name in ("precision", "recall", "f"):
        assert torch.equal(getattr(sep2, name).nan_to_num(-1), getattr(sep, name).nan_to_num(-1)), name


moderate_inputs = st.builds(
    lambda seed, pos, heads, peaked, dist: (random_attention(1, heads, heads, pos, seed=seed, peaked=peaked), dist),
    seed=st.integers(0, 10_000), pos=st.integers(2, 10), heads=st.sampled_from([2, 4]),
    peaked=st.floats(0.1, 2.0), dist=st.sampled_from(["euclidean", "cosine"]),
)


@settings(max_examples=30, deadline=None)
@given(moderate_inputs, st.floats(0.01, 100.0))
def test_scaling_values_changes_nothing(inputs, c):
    """Exact for Euclidean; for cosine the spec's 1e-12 guard breaks invariance only when
    ‖y_i‖·‖s_N‖ approaches 1e-12 (vanishing weights), so attention here is not extremely peaked."""
    (pattern, v, _), dist = inputs
    a, b = separability(pattern, v, NS, distance=dist), separability(pattern, v * c, NS, distance=dist)
    for name in ("precision", "recall", "f"):
        assert torch.equal(getattr(a, name).nan_to_num(-1), getattr(b, name).nan_to_num(-1))


def test_metrics_need_not_be_monotone_in_n():
    pattern, v, _ = random_attention(4, 4, 2, 24, seed=1)
    f = separability(pattern, v, tuple(range(1, 20))).f
    steps = f[..., 1:] - f[..., :-1]
    assert (steps > 0).any() and (steps < 0).any()


# ----- random baseline ---------------------------------------------------------------------


def test_random_baseline_is_nested_and_seeded():
    pattern, v, _ = random_attention(2, 4, 2, 12, seed=2)
    a = random_separability(pattern, v, (1, 2, 4), repeats=4, generator=torch.Generator().manual_seed(9))
    b = random_separability(pattern, v, (1, 2, 4), repeats=4, generator=torch.Generator().manual_seed(9))
    assert torch.equal(a.mean.f.nan_to_num(-1), b.mean.f.nan_to_num(-1))
    assert a.per_repeat.f.shape == (4, 2, 4, 12, 3)
    torch.testing.assert_close(a.mean.f, a.per_repeat.f.nanmean(0), equal_nan=True)
    # Euclidean N=1 random sets are still perfect: each set is scored around its own aggregate
    ok = a.mean.defined[..., 0]
    assert (a.mean.f[..., 0][ok] == 1).all()


def test_random_repeat_equals_separability_with_that_ranking():
    pattern, v, _ = random_attention(1, 2, 1, 8, seed=4)
    gen = torch.Generator().manual_seed(3)
    rnd = random_separability(pattern, v, (2, 3), repeats=1, generator=torch.Generator().manual_seed(3))
    scores = torch.rand(pattern.shape, generator=gen)
    direct = separability(pattern, v, (2, 3), ranking=scores)
    assert torch.equal(rnd.per_repeat.f[0].nan_to_num(-1), direct.f.nan_to_num(-1))


# ----- bad input ---------------------------------------------------------------------------


@pytest.mark.ill_typed
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_inputs_name_the_problem(backend):
    pattern, v, _ = random_attention(1, 2, 1, 4)
    separability = functools.partial(metrics.separability, backend=backend)
    with pytest.raises(ValueError, match="≥ 1"):
        separability(pattern, v, 0)
    with pytest.raises(ValueError, match="integers"):
        separability(pattern, v, 1.5)
    with pytest.raises(ValueError, match="v has shape"):
        separability(pattern, v[:, :3], 1)
    with pytest.raises(ValueError, match="does not divide"):
        separability(pattern[:, :1].expand(1, 3, 4, 4), torch.randn(1, 4, 2, 4), 1)
    with pytest.raises(ValueError, match="sum to 1"):
        separability(pattern * 0.5, v, 1)
    for bad in (torch.nan, torch.inf):  # the two backends used to disagree silently
        broken = v.clone()
        broken[0, 2, 0, 1] = bad
        with pytest.raises(ValueError, match="NaN or infinite values at real keys"):
            separability(pattern, broken, 1)
    with pytest.raises(ValueError, match="negative"):
        bad = pattern.clone()
        bad[0, 0, 1] = torch.tensor([1.5, -0.5, 0, 0])
        separability(bad, v, 1)
    with pytest.raises(ValueError, match="NaN"):
        bad = pattern.clone()
        bad[0, 0, 2, 0] = math.nan
        separability(bad, v, 1)
    with pytest.raises(ValueError, match="not causal"):
        separability(torch.full_like(pattern, 0.25), v, 1)
    with pytest.raises(ValueError, match="distance"):
        separability(pattern, v, 1, distance="manhattan")
    with pytest.raises(ValueError, match="queries"):
        separability(pattern, v, 1, queries="first")
    with pytest.raises(ValueError, match="0..3"):
        separability(pattern, v, 1, queries=torch.tensor([4]))
    with pytest.raises(ValueError, match="ranking scores contain NaN"):
        separability(pattern, v, 1, ranking=torch.full_like(pattern, math.nan))
    with pytest.raises(ValueError, match="backend"):
        separability(pattern, v, 1, backend="cuda")


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000), st.lists(st.floats(0.01, 100.0), min_size=16, max_size=16))
def test_cosine_invariant_to_scaling_the_sources_of_one_query(seed, scales):
    """For query t, scaling its sources 0..t by one c_t > 0 scales every y_i and s_N alike, so its
    cosine metrics stay; later positions (scaled by other factors here) are invisible to it."""
    pattern, v, _ = random_attention(1, 2, 2, 8, seed=seed)
    base = separability(pattern, v, NS, distance="cosine")
    for t in range(8):
        factors = torch.tensor(scales[8:], dtype=v.dtype)  # a different factor for every position ...
        factors[: t + 1] = scales[t]  # ... but one for the sources query t sees
        scaled = separability(pattern, v * factors[None, :, None, None], NS, distance="cosine")
        for name in ("precision", "recall", "f"):
            assert torch.equal(getattr(scaled, name)[:, :, t].nan_to_num(-1), getattr(base, name)[:, :, t].nan_to_num(-1))
