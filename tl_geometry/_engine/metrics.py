"""The top-N metrics of one row's ranked sources, N by N.

The definitions are those of docs/metrics.md#separability, with the torch backend's tie rule
and clamps, in float64 scalar arithmetic. Top-N sets are nested, so for each N in increasing
order only the new sources update ``p_k = ⟨v_k, s_N⟩`` for the visible keys:

- Gram mode: ``p += α_i G[i, :]`` with ``G = V Vᵀ`` of the kv head (shared by every row that
  reads it); all N together cost ``max N`` row updates;
- direct mode (few rows per kv head): ``s += α_i v_i``, then ``p_k = v_k · s``.

Selected and non-candidate keys carry ``+inf`` distances (``s.excluded``), so ρ_min, the outside
count and the inversions ``Σ_{i∈S} #{j: D_j ≤ D_i}`` are branch-free loops.

A driver calls :func:`start`, then per output column ``j`` while ``N`` is below the number of
candidates: :func:`step`, and writes what it wants of the returned :class:`Step`. The
certificates of the same sets are in :mod:`.certificates`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from .options import INLINE, NO_RC, SUMS

__all__ = ["Scratch", "scratch", "Step", "COS_EPS", "dot", "start", "step", "nosink_f", "write_metrics",
           "weighted_sizes", "bits_minimum"]

# Added to cosine denominators: a zero vector has cosine 0 with everything.
COS_EPS = 1e-12
_INT_TOP = 0x7FFFFFFFFFFFFFFF

class Scratch(NamedTuple):
    """One task's working arrays (float64 over the keys unless said): weights ``alpha`` (0 off
    the candidates); ``excluded`` (0 on unselected candidates, +inf elsewhere); ``y_size``
    (‖y_k‖² Euclidean, ‖y_k‖ cosine); ``proj`` (⟨v_k, s_N⟩); ``dist``, ``near`` (distances, and
    those within ρ_max; ``dist_bits`` is ``dist`` viewed as int64); ``cell`` (one float64 and its
    int64 view ``cell_bits``: a minimum's bits back to a float); ``agg`` (``d``: s_N in direct
    mode); ``u_val`` (the selected D_i, then U_i); ``top_idx``, ``top_score`` (the ranking's best);
    ``omega`` (``α_k‖v_k‖``, Theorem 2's weights); ``reach`` (``max_{i∈S} Ĝ[i, k]``),
    ``pair_range`` (the largest and smallest ``Ĝ`` over the selected pairs) and ``pair_min``
    (per selected rank, its smallest ``Ĝ`` with another selected source): Theorems 3 and 4's running
    statistics of the top-N sets; ``gaps`` (keys; ``gaps_bits`` its int64 view) and ``e_val``
    (ranks): Theorem 4's certified ``F_j`` and its ``E_i``."""

    alpha: np.ndarray
    excluded: np.ndarray
    y_size: np.ndarray
    proj: np.ndarray
    dist: np.ndarray
    near: np.ndarray
    dist_bits: np.ndarray
    cell: np.ndarray
    cell_bits: np.ndarray
    agg: np.ndarray
    u_val: np.ndarray
    top_idx: np.ndarray
    top_score: np.ndarray
    omega: np.ndarray
    reach: np.ndarray
    pair_range: np.ndarray
    pair_min: np.ndarray
    gaps: np.ndarray
    gaps_bits: np.ndarray
    e_val: np.ndarray


@njit(cache=True, nogil=True)
def scratch(n_k, d, m):
    """Fresh :class:`Scratch` for rows of ``n_k`` keys, ``d``-dimensional values and best-``m`` lists."""
    dist, cell, gaps = np.zeros(n_k), np.zeros(1), np.zeros(n_k)
    return Scratch(np.zeros(n_k), np.zeros(n_k), np.zeros(n_k), np.zeros(n_k), dist, np.zeros(n_k),
                   dist.view(np.int64), cell, cell.view(np.int64), np.zeros(d), np.zeros(m),
                   np.zeros(m, dtype=np.int64), np.zeros(m), np.zeros(n_k), np.zeros(n_k), np.zeros(2), np.zeros(m),
                   gaps, gaps.view(np.int64), np.zeros(m))


class Step(NamedTuple):
    """One N of a row: P, R, F, the margin γ and the inversions; ρ_max, ρ_min over keys ``1..t``
    (``rho_rest``), the outside count and ``‖s_N‖`` (for the sink-excluded F and the alignments)."""

    precision: float
    recall: float
    f: float
    margin: float
    inversions: int
    rho_max: float
    rho_rest: float
    outside: int
    agg_norm: float


@njit(fastmath=SUMS, **NO_RC)
def dot(vectors, b, kv, k, y):
    """``vectors[b, kv, k] · y`` in float64: each product of widened operands (numba keeps
    ``float()`` of a float32 a float32, whose products would round before the float64 sum)."""
    acc = 0.0
    for e in range(vectors.shape[3]):
        acc += np.float64(vectors[b, kv, k, e]) * np.float64(y[e])
    return acc


@njit(**INLINE)
def weighted_sizes(values, rule, at, s):
    """``s.y_size[k]`` = ‖α_k v_k‖² (Euclidean) or ‖α_k v_k‖ (cosine) for keys ``0..t``: one row's
    sizes, which every variant of the row shares."""
    b, kv, t = at.b, at.kv, at.t
    for k in range(t + 1):
        a = s.alpha[k]
        sq = values.squares[b, kv, k]
        s.y_size[k] = a * a * sq if rule.euclidean else a * math.sqrt(sq)


@njit(**NO_RC)
def _distance(euclidean, y_size, a, proj, agg_sq, agg_norm):
    """One key's distance to s_N from ‖y‖ (or ‖y‖²), α and ⟨v, s_N⟩. Euclidean: D² − ‖s‖² =
    ‖y‖² − 2α⟨v, s⟩, never below −‖s‖² (the order of D; the radii add ‖s‖² back)."""
    if euclidean:
        return max(y_size - 2.0 * a * proj, -agg_sq)
    return 1.0 - a * proj / (y_size * agg_norm + COS_EPS)


@njit(**NO_RC)
def _count_at_most(x, n, bound):
    """#{k < n: x[k] ≤ bound}: an integer sum of comparisons, which LLVM vectorises."""
    count = 0
    for k in range(n):
        count += 1 if x[k] <= bound else 0
    return count


@njit(**NO_RC)
def bits_minimum(s, bits_of, lo, hi):
    """``min`` of the doubles whose int64 views are ``bits_of[lo:hi]`` (``s.dist_bits`` or
    ``s.gaps_bits``; +inf when empty; they hold no NaN: values and weights are finite, or
    refused). A float minimum is a serial chain that LLVM does not vectorise; the bit patterns of doubles, with the magnitude bits of negative ones flipped, order as the
    doubles do (−0 before +0, which no comparison tells apart), and their integer minimum is a
    vector loop."""
    best = _INT_TOP
    for k in range(lo, hi):
        bits = bits_of[k]
        key = bits ^ ((bits >> 63) & _INT_TOP)
        best = key if key < best else best
    if best == _INT_TOP:
        return math.inf
    s.cell_bits[0] = best ^ ((best >> 63) & _INT_TOP)
    return s.cell[0]


@njit(**NO_RC)
def _add_gram_rows(proj, gram, b, kv, alpha, order, lo, hi, n, reach, track):
    """``proj[:n] += α_i G[i, :n]`` for the sources ``order[lo:hi]`` in rank order, four (then
    two) rows per pass: the same sums in the same order as one row at a time, with a quarter of
    the loads and stores of ``proj``. With ``track``, also ``reach[:n] = max(reach, G[i, :n])``
    from the same loads (Theorem 3's statistics)."""
    rank = lo
    while rank + 4 <= hi:
        i0, i1, i2, i3 = order[rank], order[rank + 1], order[rank + 2], order[rank + 3]
        a0, a1, a2, a3 = alpha[i0], alpha[i1], alpha[i2], alpha[i3]
        for k in range(n):
            g0, g1, g2, g3 = gram[b, kv, i0, k], gram[b, kv, i1, k], gram[b, kv, i2, k], gram[b, kv, i3, k]
            proj[k] = (((proj[k] + a0 * g0) + a1 * g1) + a2 * g2) + a3 * g3
            if track:
                reach[k] = max(reach[k], float(max(max(g0, g1), max(g2, g3))))
        rank += 4
    if rank + 2 <= hi:
        i0, i1 = order[rank], order[rank + 1]
        a0, a1 = alpha[i0], alpha[i1]
        for k in range(n):
            g0, g1 = gram[b, kv, i0, k], gram[b, kv, i1, k]
            proj[k] = (proj[k] + a0 * g0) + a1 * g1
            if track:
                reach[k] = max(reach[k], float(max(g0, g1)))
        rank += 2
    if rank < hi:
        i0 = order[rank]
        a0 = alpha[i0]
        for k in range(n):
            g0 = gram[b, kv, i0, k]
            proj[k] += a0 * g0
            if track:
                reach[k] = max(reach[k], float(g0))


@njit(**NO_RC)
def _inversions(dist, n_keys, u_val, n, rho_min, rho_max, outside, near):
    """``Σ_{i selected, D_i ≥ ρ_min} #{j: D_j ≤ D_i}`` (``u_val[:n]`` the selected D_i, ``dist``
    +inf off the unselected candidates). Only the ``outside`` keys with ``D_j ≤ ρ_max`` can count:
    none, no pass; for several D_i they are gathered into ``near`` once."""
    if outside == 0:
        return 0
    above = 0
    last = 0
    for rank in range(n):
        if u_val[rank] >= rho_min:  # below ρ_min no key counts
            above += 1
            last = rank
    if above == 0:
        return 0
    if above == 1:
        return _count_at_most(dist, n_keys, u_val[last])
    m = 0
    for k in range(n_keys):  # written always, kept where near: no branch to mispredict
        near[m] = dist[k]
        m += 1 if dist[k] <= rho_max else 0
    total = 0
    for rank in range(n):
        if u_val[rank] >= rho_min:
            total += _count_at_most(near, m, u_val[rank])
    return total


@njit(**INLINE)
def start(at, s, order, n_cand, last_n):
    """Reset the row's running sums; returns the sink's rank in ``order`` (``last_n`` when it
    is not among the first ``last_n``)."""
    t = at.t
    for k in range(t + 1):
        s.proj[k] = 0.0
    for e in range(s.agg.shape[0]):
        s.agg[e] = 0.0
    sink_rank = last_n
    for rank in range(min(last_n, n_cand)):
        if order[rank] == 0:
            sink_rank = rank
    return sink_rank


@njit(**INLINE)
def _grow(values, rule, at, s, order, lo, hi, reach):
    """Add the sources ``order[lo:hi]`` to the selection: out of the candidates, into ``p``
    (Gram rows; with ``reach`` also into ``s.reach``) or the aggregate ``s_N`` (direct)."""
    b, kv, t = at.b, at.kv, at.t
    for rank in range(lo, hi):
        s.excluded[order[rank]] = math.inf
    if rule.use_gram:
        if reach and lo == 0:
            for k in range(t + 1):
                s.reach[k] = -math.inf
        _add_gram_rows(s.proj, values.gram, b, kv, s.alpha, order, lo, hi, t + 1, s.reach, reach)
        return
    for rank in range(lo, hi):
        i = order[rank]
        for e in range(values.vectors.shape[3]):
            s.agg[e] += s.alpha[i] * values.vectors[b, kv, i, e]


@njit(**INLINE)
def _aggregate_size(values, rule, at, s, order, n):
    """``‖s_N‖²``; in direct mode also ``p_k = ⟨v_k, s_N⟩`` for keys ``0..t``."""
    b, kv, t = at.b, at.kv, at.t
    agg_sq = 0.0
    if rule.use_gram:
        for rank in range(n):
            agg_sq += s.alpha[order[rank]] * s.proj[order[rank]]
        return agg_sq
    for e in range(values.vectors.shape[3]):
        agg_sq += s.agg[e] * s.agg[e]
    for k in range(t + 1):
        s.proj[k] = dot(values.vectors, b, kv, k, s.agg)
    return agg_sq


@njit(**NO_RC)
def _distances(euclidean, y_size, alpha, proj, excluded, agg_sq, agg_norm, n, bound, dist, tie):
    """``dist[k]`` for keys ``0..n-1`` (+inf where excluded); returns #{k: dist[k] ≤ bound} and, in the
    same vector loop, #{k: alpha[k] == tie} (``tie = -1``: none, as no weight is negative)."""
    count = 0
    same = 0
    for k in range(n):
        value = _distance(euclidean, y_size[k], alpha[k], proj[k], agg_sq, agg_norm) + excluded[k]
        dist[k] = value
        count += 1 if value <= bound else 0
        same += 1 if alpha[k] == tie else 0
    return count, same


@njit(**NO_RC)
def _same_vector(vectors, b, kv, i, k):
    """Whether ``vectors[b, kv, i]`` and ``vectors[b, kv, k]`` are equal, entry by entry."""
    for e in range(vectors.shape[3]):
        if vectors[b, kv, i, e] != vectors[b, kv, k, e]:
            return False
    return True


@njit(**INLINE)
def _tie_duplicates(values, at, s, i, agg_sq):
    """Euclidean N = 1: an unselected candidate with the selected source's weight and value has its
    contribution, so its distance to ``s_1`` is 0 exactly, as the selected one's: set to ``-‖s‖²``
    (the selected one's) rather than left to rounding (docs/metrics.md). Returns how many moved
    onto it. Called only where :func:`_distances` found another key of the selected one's weight;
    values are compared only where the weights tie."""
    b, kv, t = at.b, at.kv, at.t
    a = s.alpha[i]
    moved = 0
    square = values.squares[b, kv, i]
    for k in range(t + 1):
        if (s.excluded[k] == 0.0 and s.alpha[k] == a and values.squares[b, kv, k] == square and s.dist[k] != -agg_sq
                and _same_vector(values.vectors, b, kv, i, k)):
            s.dist[k] = -agg_sq
            moved += 1
    return moved


@njit(**INLINE)
def step(values, rule, at, s, order, j, full, reach):
    """Grow the selection to ``N = rule.ns[j]`` (from ``rule.ns[j - 1]``) and measure it, where it
    is defined (``N`` below the candidates: the caller stops at the first that is not).
    ``full``: also the margin and the inversions."""
    n = rule.ns[j]
    t = at.t
    _grow(values, rule, at, s, order, rule.ns[j - 1] if j > 0 else 0, n, reach)
    agg_sq = _aggregate_size(values, rule, at, s, order, n)
    agg_norm = math.sqrt(max(agg_sq, 0.0))
    rho_max = -math.inf
    for rank in range(n):
        i = order[rank]
        value = _distance(rule.euclidean, s.y_size[i], s.alpha[i], s.proj[i], agg_sq, agg_norm)
        if rule.euclidean and n == 1:  # the selected point is the aggregate: D = 0 exactly
            value = -agg_sq
        s.u_val[rank] = value  # D_i
        rho_max = max(rho_max, value)
    tie = s.alpha[order[0]] if rule.euclidean and n == 1 else -1.0  # N = 1: the selected weight's twins
    outside, same = _distances(rule.euclidean, s.y_size, s.alpha, s.proj, s.excluded, agg_sq, agg_norm, t + 1, rho_max,
                               s.dist, tie)
    if same > 1 and tie > 0.0:  # another key of its weight (zero contributions tie exactly already)
        outside += _tie_duplicates(values, at, s, order[0], agg_sq)
    if outside == 0 and not full:  # every unselected candidate beyond ρ_max: all selected inside
        rho_rest = rho_min = math.inf
        inside = n
    else:
        rho_rest = bits_minimum(s, s.dist_bits, 1, t + 1)  # ρ_min over keys 1..t, then with key 0
        rho_min = min(s.dist[0], rho_rest)
        inside = 0
        for rank in range(n):
            inside += 1 if s.u_val[rank] < rho_min else 0
    inversions = _inversions(s.dist, t + 1, s.u_val, n, rho_min, rho_max, outside, s.near) if full else 0
    p = n / (n + outside)
    rc = inside / n
    f = 2 * p * rc / (p + rc) if rc > 0 else 0.0
    if rule.euclidean:
        margin = math.sqrt(rho_min + agg_sq) - math.sqrt(max(rho_max + agg_sq, 0.0))
    else:
        margin = rho_min - rho_max
    return Step(p, rc, f, margin, inversions, rho_max, rho_rest, outside, agg_norm)


@njit(**INLINE)
def write_metrics(metrics, at, j, st, sink_selected):
    """The top-N metrics of ``st`` at the row's output ``[b, h, out, j]``."""
    b, h, q = at.b, at.h, at.out
    metrics.precision[b, h, q, j] = st.precision
    metrics.recall[b, h, q, j] = st.recall
    metrics.f[b, h, q, j] = st.f
    metrics.margin[b, h, q, j] = st.margin
    metrics.inversions[b, h, q, j] = st.inversions
    metrics.sink_selected[b, h, q, j] = sink_selected


@njit(**INLINE)
def nosink_f(s, st, n):
    """F of the same top-N set with key 0 (an unselected candidate) dropped from the candidates:
    only ρ_min, the outside count and the candidates change. Reads the last :func:`step`."""
    inside = 0
    for rank in range(n):
        inside += 1 if s.u_val[rank] < st.rho_rest else 0
    p = n / (n + st.outside - (1 if s.dist[0] <= st.rho_max else 0))
    rc = inside / n
    return 2 * p * rc / (p + rc) if rc > 0 else 0.0
