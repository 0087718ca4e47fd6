"""Lower bounds on P_N and R_N in the sink-aware regime (docs/metrics.md#regime), certified.

:func:`sink_aware_bounds` evaluates the bounds proved in ``docs/theory.md``. For a query ``t``
they use the tightest Gram bounds on its visible sources ``0..t`` (:func:`certificate_table`:
the range of the non-sink ``‖v_j‖²``, the coherence ``μ = max |cos|`` over non-sink pairs, the
range of the sink's products ``⟨v_0, v_j⟩``, ``‖v_0‖²``), evaluated in float64 with the slacks of
Lemma 3, so they are certificates of the computed measurement on every input, to the last ulp:
``precision ≥ bound.precision`` and ``recall ≥ bound.recall`` always hold (Euclidean distance).

Example:
    >>> import torch
    >>> v = torch.eye(4)[None, :, None, :] * torch.tensor([0.5, 2, 2, 2])[None, :, None, None]
    >>> pattern = torch.tensor([[1.0, 0, 0, 0], [.6, .4, 0, 0], [.5, .3, .2, 0], [.4, .3, .2, .1]])[None, None]
    >>> sink_aware_bounds(pattern, v, 2, queries="last").precision.flatten().tolist()  # orthogonal: exact
    [1.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ..config import Queries, Ranking
from .query_rows import QueryRows, as_n_tuple, query_rows
from .regime import ValueStatistics, sink_products, value_statistics
from .rounding import (
    check_gradual_underflow,
    fail_closed,
    gamma,
    gammas,
    prefix_counts,
    rounding_model_holds,
    underflow_slack,
    underflow_unit,
    unit_roundoff,
)
from .selection import precision_from_outside, squared_value_norms, top_order

__all__ = ["SinkAwareBounds", "sink_aware_bounds", "sink_aware_bounds_of", "unit_roundoff", "rounding_model_holds",
           "check_gradual_underflow", "certificate_table", "unit_certificate_table", "certificate_tables", "CERTIFICATE_KEYS"]

# The certificates' forms (docs/theory.md), each valid, the largest reported: Theorem 1 on the
# weights α and the values v, Theorem 2 on ω = α‖v‖ and the directions v/‖v‖, Theorems 3 and 4 on
# α and v with the Gram statistics of each row's own selected set (one form: they share its reads).
Form = Literal["values", "directions", "rows"]
_THEOREMS: dict[str, Form] = {"theorem_1": "values", "theorem_2": "directions", "theorem_3": "rows"}

# The rows of certificate_table, in the order the numba kernel reads them: the Gram bounds of
# Lemma 1, the two slack scales of Lemma 3 and the rounding of a working-dtype Gram entry (Lemma 5).
CERTIFICATE_KEYS = ("diag_lo", "diag_hi", "pair_hi", "pair_lo", "sink_hi", "sink_lo", "sink_sq", "slack_w", "slack_64",
                    "gram_err", "slack_abs")


@dataclass
class SinkAwareBounds:
    """Certified lower bounds on P_N and R_N, ``[batch, head, q, n]`` (NaN where undefined)."""

    n: tuple[int, ...]
    precision: Float[Tensor, "batch head q n"]
    recall: Float[Tensor, "batch head q n"]
    query_positions: Int[Tensor, "batch q"]


def _mu_plus(stats: ValueStatistics, d_head: int, roundoff: float) -> Float[Tensor, "batch kv key"]:
    """``μ⁺ = (μ + γ_{d+4})(1 + γ_{2d+8})`` per prefix: a bound on the true largest non-sink ``|cos|``
    from the computed one ``μ`` (working dtype; docs/theory.md, Lemma 3 step 2)."""
    mu_hat = stats.newest.double().cummax(-1).values
    return ((mu_hat + gamma(d_head + 4, roundoff)) * (1 + gamma(2 * d_head + 8, roundoff))).clamp(max=1.0)


def _largest_squares(squares: Tensor, mask: Tensor) -> Tensor:
    """``M`` per prefix: the largest float64 ``‖v‖²`` over its non-sink keys and the sink."""
    return torch.maximum(torch.where(mask, squares, 0.0).cummax(-1).values, squares[..., :1])


def certificate_table(stats: ValueStatistics, values: Float[Tensor, "batch kv key d"], roundoff: float,
                      squares: Float[Tensor, "batch kv key"] | None = None,
                      products: Float[Tensor, "batch kv key"] | None = None) -> dict[str, Float[Tensor, "batch kv key"]]:
    """What the certificates of every prefix ``0..t`` of ``values`` need, in float64
    (``CERTIFICATE_KEYS``), from their statistics and the float64 ``‖v‖²`` (``squares``, the
    caller's :func:`~tl_geometry.measure.selection.squared_value_norms` when it has them) and ``⟨v_0, v_j⟩``.

    Gram bounds by pair type (docs/theory.md, Lemma 1): ``diag_lo``/``diag_hi`` the range of the
    non-sink ``‖v_j‖²``; ``pair_hi = −pair_lo = μ⁺·diag_hi`` with ``μ⁺ = (μ + γ_{d+4})(1 + γ_{2d+8})``
    bounding the true largest non-sink ``|cos|`` by the computed one ``μ`` (working dtype, Lemma 3);
    ``sink_hi``/``sink_lo`` the range of ``⟨v_0, v_j⟩``; ``sink_sq = ‖v_0‖²``. Slack scales
    (Lemma 3), times ``M = max(diag_hi, sink_sq)``: ``slack_w = γ_m(u)·M`` for the measurement's
    rounding in the working precision ``roundoff`` and ``slack_64 = 16·γ_m(2⁻⁵³)·M`` for the
    certificate's own float64 arithmetic, ``m = 2(t + 1 + d_head) + 16`` for the prefix ``0..t``; ``gram_err =
    γ_{d+2}(u)·M`` bounds the rounding of an entry of the working-dtype Gram matrix (Theorem 3's
    per-row statistics, Lemma 5). A prefix without non-sink keys has zero ranges (no term uses
    them there)."""
    n_keys, d_head = values.shape[2], values.shape[3]
    mask = stats.nonsink[:, None, :]
    squares = squared_value_norms(values) if squares is None else squares
    products = sink_products(values) if products is None else products
    diag_lo = torch.where(mask, squares, torch.inf).cummin(-1).values
    diag_lo = torch.where(torch.isinf(diag_lo), 0.0, diag_lo)
    diag_hi = torch.where(mask, squares, 0.0).cummax(-1).values
    mu = _mu_plus(stats, d_head, roundoff)
    pair_hi = mu * diag_hi
    sink_hi = torch.where(mask, products, -torch.inf).cummax(-1).values
    sink_lo = torch.where(mask, products, torch.inf).cummin(-1).values
    sink_sq = squares[..., :1].expand_as(squares)
    scale = torch.maximum(diag_hi, sink_sq)  # M: _largest_squares, from the range just taken
    m = prefix_counts(n_keys, d_head, squares.device)
    eta = underflow_unit(values.dtype, roundoff)

    def slack(gamma: float | Tensor) -> Tensor:
        return torch.where(scale > 0, gamma * scale, 0.0)

    return fail_closed({
        "diag_lo": diag_lo, "diag_hi": diag_hi, "pair_hi": pair_hi, "pair_lo": -pair_hi,
        "sink_hi": torch.where(torch.isinf(sink_hi), 0.0, sink_hi),
        "sink_lo": torch.where(torch.isinf(sink_lo), 0.0, sink_lo),
        "sink_sq": sink_sq, "slack_w": slack(gammas(m, roundoff)), "slack_64": slack(16 * gammas(m, 2.0**-53)),
        "gram_err": slack(gamma(d_head + 2, roundoff)) + (d_head + 2) * eta,
        "slack_abs": underflow_slack(scale, values.dtype, roundoff, m, d_head),
    }, m, roundoff)


def unit_certificate_table(stats: ValueStatistics, values: Float[Tensor, "batch kv key d"], roundoff: float,
                           squares: Float[Tensor, "batch kv key"] | None = None,
                           products: Float[Tensor, "batch kv key"] | None = None) -> dict[str, Float[Tensor, "batch kv key"]]:
    """The same rows (``CERTIFICATE_KEYS``) for Theorem 2, the rescaled form: Theorem 1 on the unit
    vectors ``u_k = v_k/‖v_k‖`` with weights ``ω_k = α_k‖v_k‖`` (docs/theory.md). Their Gram bounds:
    ``diag_lo = diag_hi = sink_sq = 1``; ``pair_hi = −pair_lo = μ⁺`` (as in
    :func:`certificate_table`); ``sink_hi``/``sink_lo`` the range of ``cos(v_0, v_j)`` from the float64
    products and norms, widened by ``γ_{2d+8}(2⁻⁵³)``. Slack scales with ``M = 1``: ``slack_w =
    γ_m(u)·(1 + 4γ_m(2⁻⁵³))``, ``slack_64 = 18·γ_m(2⁻⁵³)`` (Lemma 4); ``gram_err`` 0 (Theorem 3
    reads Theorem 1's table). A zero vector has ``ω = 0`` and takes no part; from the first key whose
    float64 ``‖v‖²`` is subnormal on, the slacks are +inf (ω̂'s error is then absolute: fail closed)."""
    n_keys, d_head = values.shape[2], values.shape[3]
    mask = stats.nonsink[:, None, :]
    squares = squared_value_norms(values) if squares is None else squares
    norms = squares.sqrt()
    products = sink_products(values) if products is None else products
    scale = norms * norms[..., :1]
    cosines = torch.where(scale > 0, products / torch.where(scale > 0, scale, 1.0), 0.0)
    widen = gamma(2 * d_head + 8, 2.0**-53)
    sink_hi = (torch.where(mask, cosines, -torch.inf).cummax(-1).values + widen).clamp(max=1.0)
    sink_lo = (torch.where(mask, cosines, torch.inf).cummin(-1).values - widen).clamp(min=-1.0)
    one = torch.where(mask.cumsum(-1) > 0, 1.0, 0.0).to(torch.float64).expand_as(squares)
    mu = _mu_plus(stats, d_head, roundoff)
    m = prefix_counts(n_keys, d_head, squares.device)
    # a subnormal float64 ‖v‖² has an absolute error, which ω̂'s relative one does not cover (Lemma 4)
    subnormal = ((squares > 0) & (squares < torch.finfo(torch.float64).tiny)).cummax(-1).values
    full = torch.ones_like(squares).masked_fill(subnormal, torch.inf)
    return fail_closed({
        "diag_lo": one, "diag_hi": one, "pair_hi": mu * one, "pair_lo": -mu * one,
        "sink_hi": torch.where(torch.isinf(sink_hi), 0.0, sink_hi),
        "sink_lo": torch.where(torch.isinf(sink_lo), 0.0, sink_lo),
        "sink_sq": torch.ones_like(squares), "slack_w": gammas(m, roundoff) * (1 + 4 * gammas(m, 2.0**-53)) * full,
        "slack_64": 18 * gammas(m, 2.0**-53) * full, "gram_err": torch.zeros_like(squares),
        "slack_abs": underflow_slack(_largest_squares(squares, mask), values.dtype, roundoff, m, d_head),
    }, m, roundoff)


def _quadratic(sum_sq, total, sink_w, diag, pair, sink_pair, sink_sq):
    """Bound on ‖Σ w_k v_k‖² for w ≥ 0 from its non-sink ℓ2² ``sum_sq``, ℓ1 ``total`` and sink weight."""
    return diag * sum_sq + pair * (total.square() - sum_sq) + sink_sq * sink_w.square() + 2 * sink_pair * sink_w * total


def certificate_tables(stats: ValueStatistics, values: Float[Tensor, "batch kv key d"], roundoff: float,
                       squares: Float[Tensor, "batch kv key"] | None = None) -> dict[str, dict[str, Tensor]]:
    """Both certificates' tables, ``{"theorem_1": certificate_table, "theorem_2":
    unit_certificate_table}``, from one pass for the float64 squared norms and sink products.
    Refused where a thread flushes subnormals to zero (:func:`check_gradual_underflow`)."""
    check_gradual_underflow(values)
    squares = squared_value_norms(values) if squares is None else squares
    products = sink_products(values)
    return {"theorem_1": certificate_table(stats, values, roundoff, squares, products),
            "theorem_2": unit_certificate_table(stats, values, roundoff, squares, products)}


# Query rows per chunk of Theorem 3's gathered Gram rows ([b, h, q, N, key] float64 entries).
_ROW_CHUNK_ENTRIES = 1 << 24


def _certified_counts(g: dict[str, Tensor], alpha: Tensor, mass: Tensor, a_max: Tensor, upper: Tensor, lower: Tensor,
                      selected: Tensor, unselected: Tensor, positive: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The counts of a certificate from its ``U_i`` (``upper``) and ``L_j`` (``lower``): unselected
    sources not certified outside, selected sources certified inside, with Lemma 3's slacks (``mass``
    the selected weight, ``a_max`` the largest). Theorem 4 compares ``E_i`` and ``F_j`` in their
    place and proves the measured ``D_j²`` positive with ``positive`` (Lemma 6). Fails closed: a row
    whose slacks are not finite certifies nothing, and a comparison with NaN counts ``j`` outside
    and certifies no ``i`` inside."""
    # L_j less σ_j (the measurement's rounding of D_j² and of the selected D_i², and the
    # certificate's own); -inf (counted, nothing certified inside) unless L_j exceeds τ_j,
    # which proves the measured D_j² positive.
    positive = lower if positive is None else positive
    holds = torch.isfinite(g["slack_w"] + g["slack_64"] + g["gram_err"] + g["slack_abs"])
    own_error = g["slack_w"] * (alpha.square() + 2 * alpha * mass)
    exact_error = g["slack_64"] * (alpha + mass).square() + g["slack_abs"]
    certified = holds & (positive - own_error - g["slack_w"] * mass.square() - exact_error > 0)
    selected_error = g["slack_w"] * (a_max.square() + 2 * a_max * mass)
    lower = torch.where(certified, lower - own_error - selected_error - exact_error, -torch.inf)
    u_max = torch.where(selected, upper, -torch.inf).amax(-1, keepdim=True)
    l_min = torch.where(unselected, lower, torch.inf).amin(-1, keepdim=True)
    inside = selected & holds & torch.isfinite(upper) & (upper < l_min)
    return (unselected & ~(lower > u_max)).sum(-1), inside.sum(-1)


def _theorem_counts(g: dict[str, Tensor], alpha: Tensor, selected: Tensor, unselected: Tensor) -> tuple[Tensor, Tensor]:
    """Theorem 1's counts for the selected sets ``selected`` from Gram bounds ``g`` and weights
    ``alpha`` (float64 ``[b, h, q, key]``)."""
    is_sink = torch.zeros(alpha.shape[-1], dtype=torch.bool, device=alpha.device)
    is_sink[0] = True
    weights = torch.where(selected, alpha, 0.0)
    sink_w = weights[..., :1]
    total = weights[..., 1:].sum(-1, keepdim=True)
    sum_sq = weights[..., 1:].square().sum(-1, keepdim=True)
    own = torch.where(is_sink, 0.0, alpha)
    # U_i: ‖s − y_i‖² = ‖Σ_{k∈S∖i} y_k‖², with i's own weight removed from its pair type.
    upper = _quadratic(sum_sq - own.square(), total - own, torch.where(is_sink, 0.0, sink_w),
                       g["diag_hi"], g["pair_hi"], g["sink_hi"], g["sink_sq"])
    # L_j: α_j²‖v_j‖² + ‖s‖² − 2α_j⟨v_j, s⟩ with ‖s‖² and ⟨v_j, s⟩ bounded by pair type.
    s_sq_lo = _quadratic(sum_sq, total, sink_w, g["diag_lo"], g["pair_lo"], g["sink_lo"], g["sink_sq"]).clamp_min(0)
    inner_hi = torch.where(is_sink, g["sink_hi"] * total, g["pair_hi"] * total + g["sink_hi"] * sink_w)
    own_diag = torch.where(is_sink, g["sink_sq"], g["diag_lo"])  # lower bound on ‖v_j‖²
    lower = alpha.square() * own_diag + s_sq_lo - 2 * alpha * inner_hi
    return _certified_counts(g, alpha, total + sink_w, weights.amax(-1, keepdim=True), upper, lower, selected,
                             unselected)


def _row_statistics_counts(g: dict[str, Tensor], gram_rows: Tensor, order: Tensor, squares: Tensor, alpha: Tensor,
                           selected: Tensor, unselected: Tensor) -> tuple[Tensor, Tensor]:
    """Theorems 3 and 4's counts, the better of each: Lemma 2 with each row's own Gram statistics,
    the exact ``‖v_k‖²`` (``squares``), the range of ``Ĝ`` over the selected pairs and, for every
    key, its largest ``Ĝ`` with a selected source (Theorem 3); the compared form ``e_k = D_k² − ‖s‖²``
    with each selected source's smallest ``Ĝ`` with another (Theorem 4); every ``Ĝ`` widened by
    ``gram_err`` (Lemmas 5, 6). ``gram_rows`` ``[b, h, q, N, key]`` holds ``Ĝ[order[r], :]``, the
    selected sources ``order`` in rank order (pairs are read as ``Ĝ[later, earlier]``, as the
    compiled pass reads them)."""
    n = order.shape[-1]
    err = g["gram_err"]
    weights = torch.where(selected, alpha, 0.0)
    sizes = alpha.square() * squares  # α_k²‖v_k‖²
    total_size = torch.where(selected, sizes, 0.0).sum(-1, keepdim=True)
    mass = weights.sum(-1, keepdim=True)
    sum_sq = weights.square().sum(-1, keepdim=True)
    pair_hi = pair_lo = torch.zeros_like(mass)  # one source: no pair, and W² − Q = 0
    selected_sizes, selected_alpha = sizes.gather(-1, order), alpha.gather(-1, order)
    gaps_upper = -selected_sizes  # E_i; one source: e_i = −‖s‖² exactly
    if n > 1:
        pairs = gram_rows.gather(-1, order[..., None, :].expand(*order.shape, n))
        earlier = torch.ones(n, n, dtype=torch.bool, device=order.device).tril(-1)
        below = pairs.masked_fill(~earlier, torch.inf)  # Ĝ[later, earlier]: a rank's pairs are its row and column
        pair_hi = pairs.masked_fill(~earlier, -torch.inf).amax((-2, -1))[..., None] + err
        pair_lo = below.amin((-2, -1))[..., None] - err
        pair_min = torch.minimum(below.amin(-1), below.amin(-2))
        # E_i = −α_i²q_i − 2α_i(W − α_i)·min_{k∈S∖i} G_ik ≥ e_i
        gaps_upper = -selected_sizes - 2 * selected_alpha * (mass - selected_alpha) * (pair_min - err)
    # U_i: ‖Σ_{k∈S∖i} y_k‖² with its diagonal exact and its pairs at most pair_hi.
    upper = (total_size - sizes) + pair_hi * ((mass - alpha).square() - (sum_sq - alpha.square()))
    # F_j = α_j²‖v_j‖² − 2α_j⟨v_j, s⟩ ≤ e_j with ⟨v_j, s⟩ ≤ W·max_{k∈S} G_jk; L_j = F_j + ‖s‖²'s bound.
    s_sq = total_size + pair_lo * (mass.square() - sum_sq)
    s_sq_lo = s_sq.clamp_min(0)
    gaps = sizes - 2 * alpha * mass * (gram_rows.amax(-2) + err)
    lower = gaps + s_sq_lo
    a_max = weights.amax(-1, keepdim=True)
    rows = _certified_counts(g, alpha, mass, a_max, upper, lower, selected, unselected)
    # D_j² > 0 from Theorem 3's L_j, or from ‖s‖² ≥ −e_i ≥ −E_i for every selected i (Lemma 6)
    positive = gaps + torch.maximum(s_sq_lo, -gaps_upper.amin(-1, keepdim=True))
    compared = _certified_counts(g, alpha, mass, a_max, torch.zeros_like(alpha).scatter(-1, order, gaps_upper), gaps,
                                 selected, unselected, positive=positive)
    # Theorem 4 can only lose to Theorem 3 where ‖s‖²'s bound is clamped at 0: only there the larger
    # of the two, as the compiled pass (which skips Theorem 3's counts elsewhere) reports
    clamped = ~(s_sq[..., 0] > 0)
    return (torch.where(clamped, torch.minimum(rows[0], compared[0]), compared[0]),
            torch.where(clamped, torch.maximum(rows[1], compared[1]), compared[1]))


def _form_counts(g: dict[str, Tensor], form: Form, alpha: Tensor, selected: Tensor, unselected: Tensor, top: Tensor,
                 gram: Tensor | None, squares: Tensor | None, group: int) -> tuple[Tensor, Tensor]:
    """One form's counts; Theorem 3 gathers the selected sources' Gram rows a chunk of queries at
    a time (``[b, h, q, N, key]`` would be large with every query)."""
    if form != "rows":
        return _theorem_counts(g, alpha, selected, unselected)
    batch, heads, n_q, n_k = alpha.shape
    chunk = max(1, _ROW_CHUNK_ENTRIES // (batch * heads * top.shape[-1] * n_k))
    b_idx = torch.arange(batch, device=alpha.device)[:, None, None, None]
    kv_idx = (torch.arange(heads, device=alpha.device) // group)[None, :, None, None]
    parts = []
    for lo in range(0, n_q, chunk):
        q = slice(lo, lo + chunk)
        order = top[:, :, q]
        parts.append(_row_statistics_counts({k: x[:, :, q] for k, x in g.items()}, gram[b_idx, kv_idx, order], order,
                                            squares, alpha[:, :, q], selected[:, :, q], unselected[:, :, q]))
    return torch.cat([p[0] for p in parts], 2), torch.cat([p[1] for p in parts], 2)


def sink_aware_bounds(
    pattern: Float[Tensor, "batch head query key"],
    v: Float[Tensor, "batch key kv_head d_head"],
    n: int | Sequence[int],
    *,
    ranking: Ranking | Tensor = "attention",
    queries: Queries | Tensor = "all",
    exclude_sink: bool = False,
    key_mask: Bool[Tensor, "batch key"] | None = None,
    query_mask: Bool[Tensor, "batch query"] | None = None,
    window: int | None = None,
) -> SinkAwareBounds:
    """Sink-aware lower bounds on Euclidean ``P_N`` and ``R_N`` (Theorems 1–4 of ``docs/theory.md``).

    With ``U_i ≥ D_i²`` for selected and ``L_j ≤ D_j²`` for unselected sources (from the regime
    parameters of the query's prefix, or the Gram statistics of the row's own top-N set, and its
    attention weights; the largest of the four theorems' bounds is returned)::

        P_N ≥ N / (N + #{j∉S : L_j ≤ max_{i∈S} U_i})      R_N ≥ #{i∈S : U_i < min_{j∉S} L_j} / N

    Valid for any top-N set, so any ``ranking`` works; the sets are those :func:`separability`
    measures with the same arguments (same selection rule, ``exclude_sink`` removes key 0 from
    the candidates). Comparisons carry the rounding slack of Lemma 3 in the safe direction.
    Shapes as in :func:`tl_geometry.separability`; ``n`` in any order, repeats allowed. With a
    sliding ``window`` the sets and candidates are the visible sources'; Theorems 1–2 read the Gram
    bounds of the whole prefix ``0..t``, a superset of the visible keys (valid, if looser), and
    a row without its sink has no sink term.
    """
    rows = query_rows(pattern, v, queries=queries, key_mask=key_mask, query_mask=query_mask, window=window)
    return sink_aware_bounds_of(rows, as_n_tuple(n), ranking, exclude_sink)


def sink_aware_bounds_of(rows: QueryRows, ns: tuple[int, ...], ranking: Ranking | Tensor = "attention",
                         exclude_sink: bool = False) -> SinkAwareBounds:
    """:func:`sink_aware_bounds` of rows already gathered (:func:`~.query_rows.query_rows`)."""
    batch, heads, n_sel, n_k = rows.alpha.shape
    stats = value_statistics(rows.values, rows.key_mask)
    roundoff = unit_roundoff(rows.values.dtype, rows.values.device)
    index = rows.qpos[:, None, :].expand(-1, rows.values.shape[1], -1)
    alpha = rows.alpha.to(torch.float64, copy=True)  # the certificate's arithmetic: float64 in every run (Lemma 3)
    if exclude_sink:  # the sink takes no part: no weight in s_N, not an unselected source
        alpha[..., 0] = 0.0
    weights = {"values": alpha, "directions": alpha * rows.per_head(rows.squares.sqrt())[:, :, None, :], "rows": alpha}
    tables = certificate_tables(stats, rows.values, roundoff, rows.squares)
    tables["theorem_3"] = tables["theorem_1"]  # its slacks (and M) are Theorem 1's
    forms = {name: ({k: rows.per_head(x.gather(2, index))[..., None] for k, x in tables[name].items()}, form)
             for name, form in _THEOREMS.items()}  # Gram bounds [b, h, q, 1] in float64
    gram = squares = None
    if "rows" in _THEOREMS.values():  # Ĝ = V Vᵀ in the working dtype, as the compiled pass reads it
        gram = torch.matmul(rows.values, rows.values.transpose(-1, -2)).double()
        squares = rows.per_head(rows.squares)[:, :, None, :]
    candidates = rows.candidates(exclude_sink)[:, None]  # [b, 1, q, key]
    distinct = tuple(sorted(set(ns)))  # nested sets grow over increasing N
    order = top_order(rows.selection_scores(ranking, exclude_sink), min(distinct[-1], n_k))
    n_candidates = candidates.sum(-1)
    nan = torch.tensor(torch.nan, dtype=rows.alpha.dtype, device=alpha.device)
    precision, recall = {}, {}
    for n_value in distinct:
        top = order[..., :n_value]
        selected = torch.zeros(alpha.shape, dtype=torch.bool, device=alpha.device).scatter_(-1, top, True)
        # each form is a valid bound: the larger P̲ (fewer counted outside) and R̲ are reported
        counts = [_form_counts(g, form, weights[form], selected, candidates & ~selected, top, gram, squares, rows.group)
                  for g, form in forms.values()]
        outside = torch.stack([c[0] for c in counts]).amin(0)
        inside = torch.stack([c[1] for c in counts]).amax(0)
        defined = n_candidates > n_value
        # P as separability computes it, to the last bit
        precision[n_value] = torch.where(defined, precision_from_outside(n_value, outside.to(nan.dtype)), nan)
        recall[n_value] = torch.where(defined, inside.to(nan.dtype) / n_value, nan)
    return SinkAwareBounds(ns, torch.stack([precision[x] for x in ns], -1), torch.stack([recall[x] for x in ns], -1),
                           rows.qpos)
