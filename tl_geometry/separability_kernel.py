"""Fused CPU kernel for :func:`tl_geometry.metrics.separability` (numba).

The vectorised torch code makes about ten passes over a ``[batch, head, query, key]`` tensor
per N; on a CPU those passes, not the arithmetic, cost the time. This kernel does the same
computation one query row at a time, with the row's working arrays in cache, in parallel over
rows. It implements exactly the definitions of docs/metrics.md#separability as the torch path does (same tie rule,
same clamps), with scalar arithmetic in float64.

Per row (query ``t`` of one head) it ranks the candidate sources once (insertion into the
best ``max N``; ties to the lower position), then for each N in increasing order adds the new
sources to the aggregate and needs only ``p_k = ⟨v_k, s_N⟩`` for the visible keys:

- Gram mode: ``p += α_i G[i, :]`` for each new source ``i``, with ``G = V Vᵀ`` of the kv head
  (one matmul per layer, shared by every query row that reads that kv head); all N together
  cost ``max N`` row updates instead of ``len(N)`` matrix-vector products.
- Direct mode (few query rows per kv head, e.g. ``queries="last"``): ``s += α_i v_i``, then
  ``p_k = v_k · s``.

Selected and non-candidate keys carry ``+inf`` distances, so ρ_min, the outside count and the
inversions ``Σ_{i∈S} #{j: D_j ≤ D_i}`` are branch-free loops (integer sums of comparisons,
which LLVM vectorises). Example: ``tests/test_metrics.py`` runs every oracle case on this kernel.

The caller picks the mode and bounds the Gram matrix's memory (see ``metrics``).

The per-row helpers allocate nothing and are compiled without numba's reference counting
(``_nrt=False``), and take whole arrays with indices rather than row views: each call of an
ordinary numba function increments and decrements the count of every array it is handed
(atomic operations, on counts both threads share), which a profile of the analysis' pass put at
15% of its time; without them it runs about 10% faster.
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager

import torch

# numba sizes its OpenMP pool once, at import. Match torch's thread count: ranks under torchrun
# (one thread each) would otherwise start idle workers that spin against the other ranks
# (measured: 2 ranks took 37 s instead of 7 s).
os.environ.setdefault("NUMBA_NUM_THREADS", str(torch.get_num_threads()))

import numba  # noqa: E402
import numpy as np  # noqa: E402


@contextmanager
def numba_threads(threads: int):
    """Run numba's parallel loops on ``threads`` threads (at most its pool), restoring the caller's setting."""
    previous = numba.get_num_threads()
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    try:
        yield
    finally:
        numba.set_num_threads(previous)


_COS_EPS = 1e-12
# Rows per parallel task: each task allocates its scratch arrays once.
_ROWS_PER_TASK = 64


@numba.njit(cache=True, nogil=True, _nrt=False)
def _insert_top(top_idx, top_score, filled, m, k, score):
    """Offer key k to the best-m list (score descending, ties to the lower position).

    Keys are offered in *decreasing* position, so an offered key wins ties against every
    listed one. Recent keys usually carry more weight, so this order inserts fewer keys.
    """
    if filled == m and score < top_score[m - 1]:
        return filled
    pos = filled if filled < m else m - 1
    while pos > 0 and score >= top_score[pos - 1]:
        top_idx[pos] = top_idx[pos - 1]
        top_score[pos] = top_score[pos - 1]
        pos -= 1
    top_idx[pos] = k
    top_score[pos] = score
    return filled + 1 if filled < m else m


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "nsz"}, _nrt=False)
def _dot(values, b, kv, k, y):
    """``values[b, kv, k] · y`` in float64; reassociation lets LLVM vectorise the sum."""
    acc = 0.0
    for e in range(values.shape[3]):
        acc += float(values[b, kv, k, e]) * y[e]
    return acc


@numba.njit(cache=True, nogil=True)
def _products(values, with_sink):
    """``v_k · v_k`` (or ``v_k · v_0`` with ``with_sink``) in float64 for every key of
    ``[batch, kv, key, d]`` values, without a float64 copy (products of float32 entries are exact)."""
    n_batch, n_kv, n_k, _ = values.shape
    out = np.empty((n_batch, n_kv, n_k))
    for b in range(n_batch):
        for h in range(n_kv):
            for k in range(n_k):
                out[b, h, k] = _dot(values, b, h, k, values[b, h, 0] if with_sink else values[b, h, k])
    return out


@numba.njit(cache=True, nogil=True)
def squared_norms(values):
    """``‖v‖²`` in float64 over the last axis of ``[batch, kv, key, d]`` values."""
    return _products(values, False)


@numba.njit(cache=True, nogil=True)
def sink_products(values):
    """``⟨v_0, v_k⟩`` in float64 for every key: the sink's Gram row, which the certificates bound."""
    return _products(values, True)


@numba.njit(cache=True, nogil=True)
def norms_from_squares(value_sq):
    """``sqrt`` of float64 squared norms, correctly rounded (IEEE square root): the one ``‖v‖`` of
    the contribution ranking (``selection.value_norms64``)."""
    out = np.empty_like(value_sq)
    flat_in, flat_out = value_sq.reshape(-1), out.reshape(-1)
    for i in range(flat_in.shape[0]):
        flat_out[i] = math.sqrt(flat_in[i])
    return out


@numba.njit(cache=True, nogil=True, _nrt=False)
def _distance(euclidean, y_size, a, proj, agg_sq, agg_norm):
    """One key's distance to s_N from ‖y‖ (or ‖y‖²), α and ⟨v, s_N⟩. Euclidean: D² − ‖s‖² =
    ‖y‖² − 2α⟨v, s⟩, never below −‖s‖² (the order of D; the radii add ‖s‖² back)."""
    if euclidean:
        return max(y_size - 2.0 * a * proj, -agg_sq)
    return 1.0 - a * proj / (y_size * agg_norm + 1e-12)


@numba.njit(cache=True, nogil=True, _nrt=False)
def _count_at_most(x, n, bound):
    """#{k < n: x[k] ≤ bound}; an integer sum of comparisons, which LLVM vectorises."""
    count = 0
    for k in range(n):
        count += 1 if x[k] <= bound else 0
    return count


@numba.njit(cache=True, nogil=True, _nrt=False)
def _distances(euclidean, y_size, alpha, proj, excluded, agg_sq, agg_norm, n, bound, dist):
    """``dist[k]`` for every ``k < n`` (``+inf`` where excluded); returns #{k: dist[k] ≤ bound}.
    Elementwise with an integer sum, so LLVM vectorises it."""
    count = 0
    for k in range(n):
        value = _distance(euclidean, y_size[k], alpha[k], proj[k], agg_sq, agg_norm) + excluded[k]
        dist[k] = value
        count += 1 if value <= bound else 0
    return count


@numba.njit(cache=True, nogil=True, _nrt=False)
def _minimum(x, lo, hi, lanes):
    """``min(x[lo:hi])`` (+inf when empty) over eight running minima in ``lanes`` (8 entries): one
    running minimum is a serial chain that LLVM does not vectorise, eight are (measured 3× faster
    on 256 keys); the minimum is exact in any order."""
    for e in range(8):
        lanes[e] = math.inf
    end = hi - (hi - lo) % 8
    for k in range(lo, end, 8):
        for e in range(8):
            value = x[k + e]
            lanes[e] = value if value < lanes[e] else lanes[e]
    low = math.inf
    for k in range(end, hi):
        low = min(low, x[k])
    for e in range(8):
        low = min(low, lanes[e])
    return low


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "nsz"}, _nrt=False)
def _row_sum_and_negatives(rows, b, h, qi):
    """Sum (float64; NaN and inf propagate) and number of negative entries of row ``rows[b, h, qi]``."""
    total = 0.0
    negatives = 0
    for k in range(rows.shape[3]):
        a = float(rows[b, h, qi, k])
        total += a
        negatives += 1 if a < 0 else 0
    return total, negatives


@numba.njit(cache=True, nogil=True, _nrt=False)
def _add_gram_rows(proj, gram, b, kv, alpha, top_idx, lo, hi, n):
    """``proj[:n] += α_i G[i, :n]`` (``G = gram[b, kv]``) for the sources ``top_idx[lo:hi]`` in
    rank order, four (then two) rows per pass over ``proj``: the same sums in the same order as
    one row at a time, with a quarter of the loads and stores of ``proj``."""
    rank = lo
    while rank + 4 <= hi:
        i0, i1, i2, i3 = top_idx[rank], top_idx[rank + 1], top_idx[rank + 2], top_idx[rank + 3]
        a0, a1, a2, a3 = alpha[i0], alpha[i1], alpha[i2], alpha[i3]
        for k in range(n):
            proj[k] = (((proj[k] + a0 * gram[b, kv, i0, k]) + a1 * gram[b, kv, i1, k]) + a2 * gram[b, kv, i2, k]
                       + a3 * gram[b, kv, i3, k])
        rank += 4
    if rank + 2 <= hi:
        i0, i1 = top_idx[rank], top_idx[rank + 1]
        a0, a1 = alpha[i0], alpha[i1]
        for k in range(n):
            proj[k] = (proj[k] + a0 * gram[b, kv, i0, k]) + a1 * gram[b, kv, i1, k]
        rank += 2
    if rank < hi:
        i0 = top_idx[rank]
        a0 = alpha[i0]
        for k in range(n):
            proj[k] += a0 * gram[b, kv, i0, k]


@numba.njit(cache=True, nogil=True, _nrt=False)
def _inversions(dist, n_keys, u_val, n, rho_min, rho_max, outside, near):
    """``Σ_{i selected, D_i ≥ ρ_min} #{j: D_j ≤ D_i}`` (``u_val[:n]`` the selected D_i; ``dist``
    +inf off the unselected candidates). Only the ``outside`` keys with ``D_j ≤ ρ_max`` can count:
    none, no pass; for several D_i, those keys gathered into ``near`` once and each D_i counted
    over them instead of over every key (a profile put the per-D_i passes at 15% of the pass)."""
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
    for k in range(n_keys):
        if dist[k] <= rho_max:
            near[m] = dist[k]
            m += 1
    total = 0
    for rank in range(n):
        if u_val[rank] >= rho_min:
            total += _count_at_most(near, m, u_val[rank])
    return total


@numba.njit(cache=True, nogil=True, _nrt=False)
def _sizes(alpha, value_sq, b, kv, t, euclidean, y_size):
    """``y_size[k]`` = ‖α_k v_k‖² (Euclidean) or ‖α_k v_k‖ (cosine) for keys ``0..t``: one row's
    weighted sizes, which every variant of the row shares."""
    for k in range(t + 1):
        a = alpha[k]
        y_size[k] = a * a * value_sq[b, kv, k] if euclidean else a * math.sqrt(value_sq[b, kv, k])


@numba.njit(cache=True, nogil=True, _nrt=False)
def _certified_lower(lower, a, mass, slack_w, slack_64, selected_error):
    """An unselected source's ``L_j`` (computed, float64) less its slack σ_j (docs/theory.md,
    Lemma 3): the value to compare with ``max U_i``. ``-max`` (counted outside, and no selected
    source certified inside) unless ``L_j`` exceeds its slack τ_j, which proves that the
    measured ``D_j²`` is positive (the measurement clamps negative ones)."""
    own_error = slack_w * (a * a + 2 * a * mass)
    spread = a + mass
    exact_error = slack_64 * spread * spread
    if lower - own_error - slack_w * mass * mass - exact_error > 0.0:
        return lower - own_error - selected_error - exact_error
    return -1.7976931348623157e308


@numba.njit(cache=True, nogil=True, _nrt=False)
def _variant(b, t, kv, ob, oh, oq, values, value_sq, gram, use_gram, ns, euclidean, full,
             alpha, excluded, top_idx, n_cand, proj, y_size, dist, near, lanes, agg, u_val,
             out_p, out_r, out_f, out_margin, out_inv, out_sink,
             want_sink, align_sink, align_current, want_bounds, g, bound_p, bound_r,
             want_nosink, nosink_f):
    """All N of one row's selection (``top_idx``; ``alpha``/``excluded`` from the selection): the
    metric core that ``separability_rows`` and the analysis' ``layer_kernel`` share. ``full``:
    margin, inversions, sink flag and (when asked) the alignments ``cos(s_N, v_0)``, ``cos(s_N, v_t)``
    and the Theorem 1 certificates from the Gram bounds ``g[:, b, kv, t]``; otherwise P, R, F only.
    Outputs ``[batch, head, q, n]`` arrays written at ``[ob, oh, oq, j]`` per N (``ns``
    distinct, increasing): whole arrays and an index, no views (see the module's docstring).
    ``want_nosink`` (key 0 an unselected candidate at every N): also F with key 0 dropped from the candidates, into
    ``nosink_f``: the same sets, so only ρ_min, the outside count and the candidates change.
    ``y_size`` from :func:`_sizes` of the row's weights (the caller's: once for every variant)."""
    d = values.shape[3]
    for k in range(t + 1):
        proj[k] = 0.0
    for e in range(d):
        agg[e] = 0.0
    n_prev = 0
    sink_rank = ns[ns.shape[0] - 1]
    for rank in range(min(sink_rank, n_cand)):
        if top_idx[rank] == 0:
            sink_rank = rank
    diag_lo = diag_hi = pair_hi = pair_lo = sink_hi = sink_lo = sink_sq = slack_w = slack_64 = 0.0
    if want_bounds:  # the certificate's Gram bounds and slack scales at this query, shared by every N
        diag_lo, diag_hi = g[0, b, kv, t], g[1, b, kv, t]
        pair_hi, pair_lo = g[2, b, kv, t], g[3, b, kv, t]
        sink_hi, sink_lo, sink_sq = g[4, b, kv, t], g[5, b, kv, t], g[6, b, kv, t]
        slack_w, slack_64 = g[7, b, kv, t], g[8, b, kv, t]
    for j in range(ns.shape[0]):
        n = ns[j]
        if n >= n_cand:  # no unselected candidate: undefined from here on
            break
        for rank in range(n_prev, n):
            excluded[top_idx[rank]] = math.inf
        if use_gram:
            _add_gram_rows(proj, gram, b, kv, alpha, top_idx, n_prev, n, t + 1)
        else:
            for rank in range(n_prev, n):
                i = top_idx[rank]
                for e in range(d):
                    agg[e] += alpha[i] * values[b, kv, i, e]
        n_prev = n
        agg_sq = 0.0
        if use_gram:
            for rank in range(n):
                agg_sq += alpha[top_idx[rank]] * proj[top_idx[rank]]
        else:
            for e in range(d):
                agg_sq += agg[e] * agg[e]
            for k in range(t + 1):
                proj[k] = _dot(values, b, kv, k, agg)
        agg_norm = math.sqrt(max(agg_sq, 0.0))
        rho_max = -math.inf
        for rank in range(n):
            i = top_idx[rank]
            value = _distance(euclidean, y_size[i], alpha[i], proj[i], agg_sq, agg_norm)
            if euclidean and n == 1:  # the selected point is the aggregate: D = 0 exactly
                value = -agg_sq
            u_val[rank] = value  # D_i (u_val is free until the certificates)
            rho_max = max(rho_max, value)
        outside = _distances(euclidean, y_size, alpha, proj, excluded, agg_sq, agg_norm, t + 1, rho_max, dist)
        if outside == 0 and not full:  # every unselected candidate beyond ρ_max: all selected inside
            rho_rest = rho_min = math.inf  # (its value only matters for margins, inversions, NOSINK's F)
            inside = n
        else:
            rho_rest = _minimum(dist, 1, t + 1, lanes)  # ρ_min over keys 1..t, then with key 0
            rho_min = min(dist[0], rho_rest)
            inside = 0
            for rank in range(n):
                inside += 1 if u_val[rank] < rho_min else 0
        if want_nosink and n < n_cand - 1:
            inside_ns = 0
            for rank in range(n):
                inside_ns += 1 if u_val[rank] < rho_rest else 0
            p_ns = n / (n + outside - (1 if dist[0] <= rho_max else 0))
            r_ns = inside_ns / n
            nosink_f[ob, oh, oq, j] = 2 * p_ns * r_ns / (p_ns + r_ns) if r_ns > 0 else 0.0
        ginv = _inversions(dist, t + 1, u_val, n, rho_min, rho_max, outside, near) if full else 0
        p = n / (n + outside)
        rc = inside / n
        out_p[ob, oh, oq, j] = p
        out_r[ob, oh, oq, j] = rc
        out_f[ob, oh, oq, j] = 2 * p * rc / (p + rc) if rc > 0 else 0.0
        if not full:
            continue
        if euclidean:
            out_margin[ob, oh, oq, j] = math.sqrt(rho_min + agg_sq) - math.sqrt(max(rho_max + agg_sq, 0.0))
        else:
            out_margin[ob, oh, oq, j] = rho_min - rho_max
        out_inv[ob, oh, oq, j] = ginv
        out_sink[ob, oh, oq, j] = sink_rank < n
        if want_sink:
            align_sink[ob, oh, oq, j] = proj[0] / (agg_norm * math.sqrt(value_sq[b, kv, 0]) + _COS_EPS)
            align_current[ob, oh, oq, j] = proj[t] / (agg_norm * math.sqrt(value_sq[b, kv, t]) + _COS_EPS)
        if want_bounds:
            # Theorem 1 from the selected weights: W, Q of the non-sink ones, the sink's w_0, the
            # largest selected weight and the selected mass (the slacks of Lemma 3 scale with them).
            w0 = 0.0
            total = 0.0
            sum_sq = 0.0
            a_max = 0.0
            for rank in range(n):
                i = top_idx[rank]
                a_max = max(a_max, alpha[i])
                if i == 0:
                    w0 = alpha[0]
                else:
                    total += alpha[i]
                    sum_sq += alpha[i] * alpha[i]
            mass = total + w0
            u_max = -math.inf
            for rank in range(n):  # U_i = Q⁺(w^S − α_i e_i)
                i = top_idx[rank]
                own = 0.0 if i == 0 else alpha[i]
                s_w = 0.0 if i == 0 else w0
                q_sq = sum_sq - own * own
                q_tot = total - own
                u_val[rank] = (diag_hi * q_sq + pair_hi * (q_tot * q_tot - q_sq) + sink_sq * s_w * s_w
                               + 2 * sink_hi * s_w * q_tot)
                u_max = max(u_max, u_val[rank])
            s_sq_lo = max(diag_lo * sum_sq + pair_lo * (total * total - sum_sq) + sink_sq * w0 * w0
                          + 2 * sink_lo * w0 * total, 0.0)
            selected_error = slack_w * (a_max * a_max + 2 * a_max * mass)
            # L_j less its slack (see _certified_lower); +inf (excluded) drops selected and
            # non-candidates from the minimum and the count, so they need no branch.
            inner = pair_hi * total + sink_hi * w0
            outside_b = 0  # counted as the values are written (one pass, vectorised)
            for k in range(1, t + 1):
                a = alpha[k]
                value = _certified_lower(a * a * diag_lo + s_sq_lo - 2 * a * inner, a, mass, slack_w, slack_64,
                                         selected_error) + excluded[k]
                dist[k] = value
                outside_b += 1 if value <= u_max else 0
            a = alpha[0]
            if excluded[0] == 0.0:  # the unselected sink: its own norm and Gram bounds
                dist[0] = _certified_lower(a * a * sink_sq + s_sq_lo - 2 * a * (sink_hi * total), a, mass, slack_w,
                                           slack_64, selected_error)
            else:
                dist[0] = math.inf
            outside_b += 1 if dist[0] <= u_max else 0
            inside_b = n  # no L_j ≤ max U_i: every selected source is certified inside
            if outside_b > 0:
                l_min = _minimum(dist, 0, t + 1, lanes)
                inside_b = 0
                for rank in range(n):
                    inside_b += 1 if u_val[rank] < l_min else 0
            bound_p[ob, oh, oq, j] = n / (n + outside_b)
            bound_r[ob, oh, oq, j] = inside_b / n
    # Unselected candidates keep excluded = 0 for the next variant's reset (done by _select).


@numba.njit(cache=True, nogil=True, _nrt=False)
def _rows_of_task(task, scratch, rows, scores, ranking_mode, qpos, qvalid, key_mask, values, value_sq, value_norm64, gram,
                  use_gram, ns, exclude_sink, euclidean, group,
                  precision, recall, f, margin, inversions, sink, row_sum, negatives, visible_sum):
    """The rows of one task of :func:`separability_rows`, with its scratch arrays: no reference
    counting (see the module's docstring)."""
    alpha, excluded, y_size, proj, top_idx, top_score, dist, near, lanes, agg, u_val, no_bounds = scratch
    n_batch, n_heads, n_q, _ = rows.shape
    n_rows = n_batch * n_heads * n_q
    max_n = ns[ns.shape[0] - 1]
    for r in range(task * _ROWS_PER_TASK, min(n_rows, (task + 1) * _ROWS_PER_TASK)):
        b = r // (n_heads * n_q)
        h = (r // n_q) % n_heads
        qi = r % n_q
        kv = h // group
        t = qpos[b, qi]
        row_sum[b, h, qi], negatives[b, h, qi] = _row_sum_and_negatives(rows, b, h, qi)
        # Candidates, weights and the best max-N sources by the ranking.
        mass = 0.0
        n_cand = 0
        filled = 0
        m = min(max_n, t + 1)
        for k in range(t, -1, -1):
            a = float(rows[b, h, qi, k])
            visible = key_mask[b, k]
            mass += a if visible else 0.0
            visible = visible and not (exclude_sink and k == 0)
            alpha[k] = a if visible else 0.0
            excluded[k] = 0.0 if visible else math.inf
            if not visible:
                continue
            n_cand += 1
            if ranking_mode == 0:
                score = a
            elif ranking_mode == 1:
                score = a * value_norm64[b, kv, k]
            else:  # -inf is still a candidate: above every non-candidate
                score = max(float(scores[b, h, qi, k]), -1.7976931348623157e308)
            filled = _insert_top(top_idx, top_score, filled, m, k, score)
        visible_sum[b, h, qi] = mass
        if not qvalid[b, qi]:
            continue
        _sizes(alpha, value_sq, b, kv, t, euclidean, y_size)
        _variant(b, t, kv, b, h, qi, values, value_sq, gram, use_gram, ns, euclidean, True,
                 alpha, excluded, top_idx, n_cand, proj, y_size, dist, near, lanes, agg, u_val,
                 precision, recall, f, margin, inversions, sink,
                 False, precision, precision, False, no_bounds, precision, precision, False, precision)


@numba.njit(parallel=True, cache=True, nogil=True)
def separability_rows(rows, scores, ranking_mode, qpos, qvalid, key_mask, values, value_sq, value_norm64, gram, use_gram,
                      ns, exclude_sink, euclidean, group,
                      precision, recall, f, margin, inversions, sink, row_sum, negatives, visible_sum):
    """Fill the output arrays for every row of ``rows`` ``[batch, head, q, key]``.

    scores: same shape as rows when ``ranking_mode == 2`` (0 = attention, 1 = α‖v‖ with ``‖v‖`` from
    ``value_norm64``, ``[batch, kv, key]`` float64: ``selection.value_norms64``).
    qpos, qvalid: ``[batch, q]``; key_mask ``[batch, key]``; values ``[batch, kv, key, d]``;
    value_sq ``[batch, kv, key]`` (float64); gram ``[batch, kv, key, key]`` when ``use_gram``.
    ns: the distinct N in increasing order (output column j holds ``ns[j]``).
    Outputs ``[batch, head, q, n]`` (pre-filled with NaN / False by the caller) and the row
    checks ``[batch, head, q]``: sum over the whole row, its number of negative entries, and
    its mass on visible keys.
    """
    n_batch, n_heads, n_q, n_k = rows.shape
    d = values.shape[3]
    n_rows = n_batch * n_heads * n_q
    max_n = ns[ns.shape[0] - 1]
    n_tasks = (n_rows + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK
    for task in numba.prange(n_tasks):
        alpha = np.zeros(n_k)
        # 0 on unselected candidates, +inf elsewhere: added to a distance, it drops the key out
        # of ρ_min, the outside count and the inversions without a branch.
        excluded = np.zeros(n_k)
        y_size = np.zeros(n_k)  # ‖y_k‖² (Euclidean) or ‖y_k‖ (cosine)
        proj = np.zeros(n_k)  # ⟨v_k, s_N⟩
        top_idx = np.zeros(max_n, dtype=np.int64)
        top_score = np.zeros(max_n)
        dist = np.zeros(n_k)
        near = np.zeros(n_k)
        lanes = np.zeros(8)
        agg = np.zeros(d)
        u_val = np.zeros(max_n)
        no_bounds = np.zeros((9, 1, 1, 1))
        scratch = (alpha, excluded, y_size, proj, top_idx, top_score, dist, near, lanes, agg, u_val, no_bounds)
        _rows_of_task(task, scratch, rows, scores, ranking_mode, qpos, qvalid, key_mask, values, value_sq, value_norm64, gram,
                      use_gram, ns, exclude_sink, euclidean, group,
                      precision, recall, f, margin, inversions, sink, row_sum, negatives, visible_sum)
