"""Fused CPU kernel of the whole per-layer analysis (numba): one pass over the attention rows.

``tl_geometry.analyze`` needs, per layer, the row checks and taxonomy votes of every query, and
for the chosen queries the top-N metrics, the same with the sink excluded, the random baseline,
the sink statistics, the alignments of ``s_N`` and the sink-aware certificates. Done as
separate torch passes each re-gathers, re-validates and re-ranks the same rows; here one task
per (sequence, head) walks its rows once and computes all of it from the same working arrays:

- every row: sum / negative entries / visible mass over keys ``0..t`` (the distribution
  checks) and the winner ``argmax α_j‖v_j‖`` (in the pattern's dtype, ties to the lower
  position), tallied as votes;
- every chosen row, for each *variant* (top-N of the ranking; sink excluded; each random
  ranking): the best-``max N`` sources by one insertion pass, then per N the new sources' Gram
  rows (or direct products) update ``⟨v_k, s_N⟩``; distances, radii and counts as in
  ``separability_kernel`` (same arithmetic, float64);
- the top-N variant also gives ``cos(s_N, v_0)``, ``cos(s_N, v_t)`` (from ``⟨v_0, s_N⟩`` and
  ``⟨v_t, s_N⟩``, already computed), the sink's mass and rank, and the Theorem 1 certificates
  from the certificate's Gram bounds at ``t`` (docs/theory.md; slacks of Lemma 3).

Equivalence with the separate functions (``separability``, ``sink_geometry``,
``sink_aware_bounds``, ``winner_sources``) is tested in ``tests/test_layer_measures.py``.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from .separability_kernel import _insert_top, _sizes, _variant


@numba.njit(cache=True, nogil=True, _nrt=False)
def _select(rows, b, h, t, kv, key_mask, value_norm64, ranking_mode, exclude_sink, max_n,
            alpha, excluded, top_idx, top_score):
    """Weights, candidate flags (``excluded``: 0 candidate, +inf otherwise) and the best-``max_n``
    candidates of one row by attention (mode 0) or α‖v‖ (mode 1); returns (candidates, selected)."""
    n_cand = 0
    filled = 0
    m = min(max_n, t + 1)
    for k in range(t, -1, -1):
        a = float(rows[b, h, t, k])
        candidate = key_mask[b, k] and not (exclude_sink and k == 0)
        alpha[k] = a if candidate else 0.0
        excluded[k] = 0.0 if candidate else math.inf
        if not candidate:
            continue
        n_cand += 1
        score = a if ranking_mode == 0 else a * value_norm64[b, kv, k]
        filled = _insert_top(top_idx, top_score, filled, m, k, score)
    return n_cand, filled


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@numba.njit(cache=True, nogil=True, _nrt=False)
def _mix(z):
    """splitmix64's finaliser: a bijective scramble of 64 bits."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@numba.njit(cache=True, nogil=True, _nrt=False)
def _sample(cand, n_cand, m, key, h, t, r, top_idx):
    """A uniformly random ordered sample of ``m`` of the ``n_cand`` candidates (partial
    Fisher–Yates), drawn from a counter-based stream keyed by (window and layer ``key``, head,
    query, repeat): the same draws whatever the batching, sharding or backend."""
    state = _mix(key ^ _mix(np.uint64(h) * np.uint64(0xD1B54A32D192ED03)
                            + np.uint64(t) * np.uint64(0xABC98388FB8FAC03) + np.uint64(r) + np.uint64(1)))
    for rank in range(m):
        state = state + _GOLDEN
        u = (_mix(state) >> np.uint64(11)) * (1.0 / 9007199254740992.0)  # 53 bits in [0, 1)
        j = rank + min(int(u * (n_cand - rank)), n_cand - rank - 1)
        chosen = cand[j]
        cand[j] = cand[rank]
        cand[rank] = chosen
        top_idx[rank] = chosen


@numba.njit(cache=True, nogil=True, _nrt=False)
def _candidates(key_mask, b, t, exclude_sink, cand):
    """The candidate sources of row ``t`` in increasing position into ``cand``; returns their number."""
    n_cand = 0
    for k in range(t + 1):
        if key_mask[b, k] and not (exclude_sink and k == 0):
            cand[n_cand] = k
            n_cand += 1
    return n_cand


@numba.njit(cache=True, nogil=True, _nrt=False)
def _random_order(key_mask, b, h, t, exclude_sink, max_n, key, r, cand, top_idx):
    """The candidates of row ``t`` into ``cand``, then :func:`_sample`; returns their number."""
    n_cand = _candidates(key_mask, b, t, exclude_sink, cand)
    _sample(cand, n_cand, min(max_n, n_cand), key, h, t, r, top_idx)
    return n_cand


@numba.njit(cache=True, nogil=True, _nrt=False)
def _unselect(excluded, top_idx, m):
    """After a variant: its selected sources (candidates all) back to ``excluded = 0``."""
    for rank in range(m):
        excluded[top_idx[rank]] = 0.0


@numba.njit(parallel=True, cache=True, nogil=True)
def random_top_orders(keys, key_mask, qpos, qvalid, n_heads, repeats, max_n, exclude_sink, out):
    """The random rankings' best-``max_n`` sources ``out[repeat, batch, head, q, :]`` (-1 past the
    candidates), exactly as the fused pass draws them; for the torch backend and the tests."""
    n_batch, n_q = qpos.shape
    n_k = key_mask.shape[1]
    for task in numba.prange(n_batch * n_heads):
        b = task // n_heads
        h = task % n_heads
        cand = np.zeros(n_k, dtype=np.int64)
        top_idx = np.zeros(max_n, dtype=np.int64)
        for qi in range(n_q):
            t = qpos[b, qi]
            if not qvalid[b, qi]:
                continue
            for r in range(repeats):
                n_cand = _random_order(key_mask, b, h, t, exclude_sink, max_n, keys[b], r, cand, top_idx)
                for rank in range(min(max_n, n_cand)):
                    out[r, b, h, qi, rank] = top_idx[rank]


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract", "nsz"}, _nrt=False)
def _row_scan(rows, key_mask, norms, b, h, kv, t, scores):
    """One pass over keys ``0..t`` of row ``rows[b, h, t]``: its sum (float64; NaN and inf
    propagate), number of negative entries and mass on the visible keys (the distribution
    checks), and the winner scores ``α_k‖v_k‖`` (the pattern's dtype; ``norms[b, kv]``) into
    ``scores``, -1 where not visible."""
    total = 0.0
    visible = 0.0
    negatives = 0
    for k in range(t + 1):
        a = rows[b, h, t, k]
        fa = float(a)
        total += fa
        visible += fa if key_mask[b, k] else 0.0
        negatives += 1 if fa < 0 else 0
        scores[k] = a * norms[b, kv, k] if key_mask[b, k] else -1.0
    return total, negatives, visible


_BLOCK = 16


def integer_like(itemsize: int) -> np.ndarray:
    """An empty integer array of ``itemsize`` bytes an entry (a float32 → int32, float64 → int64):
    the type of the scratch in which the kernels read non-negative floats as their bit patterns."""
    return np.empty(0, dtype=np.dtype(f"i{itemsize}"))


@numba.njit(cache=True, nogil=True, _nrt=False)
def _first_maximum(scores, bits, n):
    """The first position of the largest of ``scores[:n]`` (-1 when none is ≥ 0): the winner, ties
    to the lower position. ``bits`` is ``scores`` viewed as same-width integers: scores ≥ 0 (valid
    rows; -0 made +0 first) order as their bit patterns do, so the maximum and the search are
    integer loops that LLVM vectorises (a float maximum is a serial chain it does not)."""
    for k in range(n):
        scores[k] = scores[k] + 0.0
    best = -1
    for k in range(n):
        best = max(best, bits[k])
    if best < 0:
        return -1
    n_w = n - n % _BLOCK
    for k0 in range(0, n_w, _BLOCK):
        hits = 0
        for e in range(_BLOCK):
            hits += 1 if bits[k0 + e] == best else 0
        if hits:
            for k in range(k0, k0 + _BLOCK):
                if bits[k] == best:
                    return k
    for k in range(n_w, n):
        if bits[k] == best:
            return k
    return -1


@numba.njit(cache=True, nogil=True, _nrt=False)
def _prf(b, t, kv, values, value_sq, gram, use_gram, ns, euclidean, alpha, excluded, top_idx, n_cand,
         proj, y_size, dist, near, lanes, agg, u_val, part_p, part_r, part_f, no_flags, g):
    """P, R, F only (NOSINK, RANDOM) of the selection ``top_idx`` into ``part_*[0, 0, 0, :]``,
    NaN where undefined; the other outputs of :func:`_variant` are not written."""
    for j in range(ns.shape[0]):
        part_p[0, 0, 0, j] = part_r[0, 0, 0, j] = part_f[0, 0, 0, j] = np.nan
    _variant(b, t, kv, 0, 0, 0, values, value_sq, gram, use_gram, ns, euclidean, False,
             alpha, excluded, top_idx, n_cand, proj, y_size, dist, near, lanes, agg, u_val,
             part_p, part_r, part_f, part_p, part_p, no_flags,
             False, part_p, part_p, False, g, part_p, part_p, False, part_p)


@numba.njit(cache=True, nogil=True, _nrt=False)
def _task_rows(b, h, kv, scratch, rows, key_mask, query_mask, last, geometry_all, taxonomy_all,
               values, value_sq, value_norm, value_norm64, bits_like, gram, use_gram, ns, ranking_mode, exclude_sink,
               euclidean, group, random_keys, n_random, want_sink, want_bounds, g,
               tolerance, row_sum, negatives, visible_sum, bad_rows, votes, offsets,
               precision, recall, f, margin, inversions, sink, sink_mass, sink_rank,
               align_sink, align_current, bound_p, bound_r, f_nosink, random_sum):
    """The rows of one (sequence, head) task of :func:`layer_rows` (its arguments, and the task's
    scratch arrays): compiled without reference counting, as its helpers are (see
    ``separability_kernel``); in the parallel loop's own body the counts cost 12% of the pass."""
    (alpha, excluded, y_size, proj, dist, near, lanes, score_bits, scores, agg, top_idx, top_score, sub_idx, u_val,
     cand, cand_base, part_p, part_r, part_f, no_flags) = scratch
    n_q = rows.shape[2]
    max_n = ns[ns.shape[0] - 1]
    lo, hi = (0, n_q) if (geometry_all or taxonomy_all) else (last[b], last[b] + 1)
    for t in range(lo, hi):
        # Keys 0..t only: a causal model's later entries are the softmax's exact zeros, and
        # mass there would leave these sums short of 1 (refused). Halves the bytes read.
        row_sum[b, h, t], negatives[b, h, t], visible_sum[b, h, t] = _row_scan(
            rows, key_mask, value_norm, b, h, kv, t, scores)
        best = _first_maximum(scores, score_bits, t + 1)
        valid = query_mask[b, t]
        if not valid:
            continue
        total = row_sum[b, h, t]
        if (not math.isfinite(total) or negatives[b, h, t] > 0 or abs(total - 1) > tolerance
                or total - visible_sum[b, h, t] > tolerance):
            bad_rows[b, h] += 1  # query_rows.check_distribution's conditions: it names the fault
        if (taxonomy_all or t == last[b]) and t > 0 and best >= 0:
            if best == t:
                votes[b, h, 0] += 1
            elif best == 0:
                votes[b, h, 1] += 1
            else:
                votes[b, h, 2] += 1
                offsets[b, h, t - best] += 1
        if not (geometry_all or t == last[b]):
            continue
        qi = t if geometry_all else 0
        # Variant TOP: the ranking's own top-N sets, every output. The selection keeps one
        # source more than max N: without the sink it is NOSINK's selection.
        n_cand, filled = _select(rows, b, h, t, kv, key_mask, value_norm64, ranking_mode,
                                 exclude_sink, max_n + 1, alpha, excluded, top_idx, top_score)
        listed = -1  # the sink's place in TOP's list, where it is a listed candidate
        for rank in range(filled if not exclude_sink else 0):
            if top_idx[rank] == 0:
                listed = rank
        if want_sink and listed >= 0:
            sink_mass[b, h, qi] = float(rows[b, h, t, 0])
            # the list is ordered by score, ties to the lower position: those before the sink
            # are exactly the sources that outrank it
            sink_rank[b, h, qi] = listed
        elif want_sink:
            sink_mass[b, h, qi] = float(rows[b, h, t, 0]) if key_mask[b, 0] else 0.0
            # sources ranked before the sink (all visible keys compete, sink ties win)
            s0 = -math.inf
            if key_mask[b, 0]:
                s0 = float(rows[b, h, t, 0])
                if ranking_mode == 1:
                    s0 *= value_norm64[b, kv, 0]
            ahead = 0
            for k in range(1, t + 1):
                if not key_mask[b, k]:
                    continue
                a = float(rows[b, h, t, k])
                s = a if ranking_mode == 0 else a * value_norm64[b, kv, k]
                ahead += 1 if s > s0 else 0
            sink_rank[b, h, qi] = ahead
        # The sink an unselected candidate at every N: NOSINK has TOP's sets, and TOP's pass
        # gives its F too.
        nosink_in_top = want_sink and not exclude_sink and key_mask[b, 0] and not 0 <= listed < max_n
        _sizes(alpha, value_sq, b, kv, t, euclidean, y_size)  # shared by every variant of the row
        _variant(b, t, kv, b, h, qi, values, value_sq, gram, use_gram, ns, euclidean, True,
                 alpha, excluded, top_idx, n_cand, proj, y_size, dist, near, lanes, agg, u_val,
                 precision, recall, f, margin, inversions, sink, want_sink, align_sink, align_current,
                 want_bounds, g, bound_p, bound_r, nosink_in_top, f_nosink)
        _unselect(excluded, top_idx, min(filled, max_n))
        if want_sink and (exclude_sink or not key_mask[b, 0]):  # the sink is no candidate: NOSINK is TOP
            for j in range(ns.shape[0]):
                f_nosink[b, h, qi, j] = f[b, h, qi, j]
        elif want_sink and not nosink_in_top:  # Variant NOSINK: key 0 removed from the candidates, F only
            m = 0
            for rank in range(filled):
                if top_idx[rank] != 0 and m < max_n:
                    sub_idx[m] = top_idx[rank]
                    m += 1
            sink_alpha, sink_size = alpha[0], y_size[0]
            alpha[0] = y_size[0] = 0.0
            excluded[0] = math.inf
            n_nosink = n_cand - 1 if key_mask[b, 0] else n_cand
            _prf(b, t, kv, values, value_sq, gram, use_gram, ns, euclidean, alpha, excluded, sub_idx, n_nosink,
                 proj, y_size, dist, near, lanes, agg, u_val, part_p, part_r, part_f, no_flags, g)
            for j in range(ns.shape[0]):
                f_nosink[b, h, qi, j] = part_f[0, 0, 0, j]
            _unselect(excluded, sub_idx, m)
            alpha[0], y_size[0] = sink_alpha, sink_size
            excluded[0] = 0.0 if key_mask[b, 0] else math.inf
        # Variant RANDOM: P, R, F summed over the repeats; the candidates listed once per row.
        n_random_cand = _candidates(key_mask, b, t, exclude_sink, cand_base) if n_random else 0
        m = min(max_n, n_random_cand)
        for r in range(n_random):
            for k in range(n_random_cand):
                cand[k] = cand_base[k]
            _sample(cand, n_random_cand, m, random_keys[b], h, t, r, sub_idx)
            _prf(b, t, kv, values, value_sq, gram, use_gram, ns, euclidean, alpha, excluded, sub_idx, n_random_cand,
                 proj, y_size, dist, near, lanes, agg, u_val, part_p, part_r, part_f, no_flags, g)
            _unselect(excluded, sub_idx, m)
            for j in range(ns.shape[0]):
                if not np.isnan(part_p[0, 0, 0, j]):
                    random_sum[0, b, h, qi, j] += part_p[0, 0, 0, j]
                    random_sum[1, b, h, qi, j] += part_r[0, 0, 0, j]
                    random_sum[2, b, h, qi, j] += part_f[0, 0, 0, j]


@numba.njit(parallel=True, cache=True, nogil=True)
def layer_rows(rows, key_mask, query_mask, last, geometry_all, taxonomy_all,
               values, value_sq, value_norm, value_norm64, bits_like, gram, use_gram, ns, ranking_mode, exclude_sink,
               euclidean, group, random_keys, n_random, want_sink, want_bounds, g,
               tolerance, row_sum, negatives, visible_sum, bad_rows, votes, offsets,
               precision, recall, f, margin, inversions, sink, sink_mass, sink_rank,
               align_sink, align_current, bound_p, bound_r, f_nosink, random_sum):
    """Fill every output for the rows of ``rows`` ``[batch, head, query, key]``.

    last ``[batch]``: the last real query; ``geometry_all`` / ``taxonomy_all``: every query (else
    only the last) is measured / votes. ``bits_like``: an empty integer array of the pattern's
    width (the winner search's scratch type, see :func:`_first_maximum`). Geometry outputs are ``[batch, head, q, n]`` with
    ``q = query`` (all) or 1 (last), pre-filled with NaN / False by the caller; ``random_sum``
    ``[3, batch, head, q, n]`` sums P, R, F over ``n_random`` uniformly random rankings per row,
    drawn from ``random_keys`` ``[batch]`` (one key per window and layer, see :func:`_sample`). ``row_sum`` etc. ``[batch, head, query]`` (rows not
    visited stay 0 and are not checked); ``bad_rows`` ``[batch, head]`` counts the real rows that
    fail a distribution check at ``tolerance``; ``votes`` ``[batch, head, 3]``, ``offsets``
    ``[batch, head, key]`` are added to. ``g`` ``[9, batch, kv, key]``: the certificates' Gram bounds and slack scales
    at each query (``regime.CERTIFICATE_KEYS``). ``value_norm64``: the contribution ranking's ‖v‖
    (float64, ``selection.value_norms64``); ``value_norm``: the taxonomy's (the pattern's dtype).
    """
    n_batch, n_heads, n_q, n_k = rows.shape
    d = values.shape[3]
    max_n = ns[ns.shape[0] - 1]
    for task in numba.prange(n_batch * n_heads):
        b = task // n_heads
        h = task % n_heads
        kv = h // group
        alpha = np.zeros(n_k)
        excluded = np.zeros(n_k)
        y_size = np.zeros(n_k)
        proj = np.zeros(n_k)
        dist = np.zeros(n_k)
        near = np.zeros(n_k)  # the keys that can count as inversions (see _inversions)
        lanes = np.zeros(8)
        score_bits = np.zeros(n_k, dtype=bits_like.dtype)
        scores = score_bits.view(rows.dtype)
        agg = np.zeros(d)
        top_idx = np.zeros(max_n + 1, dtype=np.int64)
        top_score = np.zeros(max_n + 1)
        sub_idx = np.zeros(max_n, dtype=np.int64)
        u_val = np.zeros(max_n)
        cand = np.zeros(n_k, dtype=np.int64)
        cand_base = np.zeros(n_k, dtype=np.int64)
        # P, R, F of the variants other than TOP, at [0, 0, 0, j] (outputs of _variant's shape)
        part_p = np.zeros((1, 1, 1, ns.shape[0]))
        part_r = np.zeros((1, 1, 1, ns.shape[0]))
        part_f = np.zeros((1, 1, 1, ns.shape[0]))
        no_flags = np.zeros((1, 1, 1, ns.shape[0]), dtype=np.bool_)  # not written (full=False)
        scratch = (alpha, excluded, y_size, proj, dist, near, lanes, score_bits, scores, agg, top_idx, top_score,
                   sub_idx, u_val, cand, cand_base, part_p, part_r, part_f, no_flags)
        _task_rows(b, h, kv, scratch, rows, key_mask, query_mask, last, geometry_all, taxonomy_all,
                   values, value_sq, value_norm, value_norm64, bits_like, gram, use_gram, ns, ranking_mode,
                   exclude_sink, euclidean, group, random_keys, n_random, want_sink, want_bounds, g,
                   tolerance, row_sum, negatives, visible_sum, bad_rows, votes, offsets,
                   precision, recall, f, margin, inversions, sink, sink_mass, sink_rank,
                   align_sink, align_current, bound_p, bound_r, f_nosink, random_sum)


@numba.njit(parallel=True, cache=True, nogil=True, fastmath={"nnan", "ninf", "nsz", "reassoc"})
def pair_cosine_statistics(gram, norms, nonsink, bits_like, newest, largest, total):
    """|cos| of every pair of non-sink keys from the Gram matrix, without holding the cosine
    matrix: ``newest[b, kv, t] = max_{i<t} |cos(v_t, v_i)|`` (0 without such a pair), and per
    (sequence, kv head) the largest and the sum over ordered pairs i ≠ j. Cosines are
    ``G[t, i]·(1/‖v_t‖)·(1/‖v_i‖)`` in the values' dtype (norms clamped to the dtype's tiny;
    non-sink keys get the reciprocal 0, so the loops need no branch). Inputs are finite.
    ``bits_like``: an empty integer array of the values' width: a row's |cos| are ≥ 0, so their
    maximum is an integer maximum of their bit patterns, which LLVM vectorises (1.7× faster)."""
    n_batch, n_kv, n_k, _ = gram.shape
    tiny = np.finfo(norms.dtype).tiny
    for task in numba.prange(n_batch * n_kv):
        b = task // n_kv
        h = task % n_kv
        inverse = np.zeros(n_k, dtype=norms.dtype)
        row_bits = np.zeros(n_k, dtype=bits_like.dtype)
        row = row_bits.view(norms.dtype)
        top_bits = np.zeros(1, dtype=bits_like.dtype)
        top_value = top_bits.view(norms.dtype)  # the maximum's bits read back as a float
        for k in range(n_k):
            if nonsink[b, k]:
                inverse[k] = 1 / max(norms[b, h, k], tiny)
        best = 0.0
        summed = 0.0
        for t in range(n_k):
            scale = inverse[t]
            row_sum = 0.0
            for i in range(t):  # indexed, not a row view (a view is reference-counted)
                c = abs(gram[b, h, t, i]) * scale * inverse[i]
                row[i] = c
                row_sum += c
            top = 0  # the bits of +0.0: the maximum without pairs
            for i in range(t):
                top = max(top, row_bits[i])
            top_bits[0] = top
            row_max = top_value[0]
            newest[b, h, t] = row_max
            best = max(best, float(row_max))
            summed += 2.0 * row_sum
        largest[b, h] = best
        total[b, h] = summed
