"""The layer pass: everything ``tl_geometry.analyze`` measures on one layer, in one walk over its rows.

One task per (sequence, head) visits its rows once:

- every row: the distribution checks and the taxonomy's winner ``argmax α_j‖v_j‖``, tallied as
  votes;
- every measured row, for each *variant* of its selection: TOP (the ranking's own top-N sets:
  every metric, the sink's standing, the alignments of ``s_N`` and the certificates), NOSINK
  (key 0 removed from the candidates: F only) and each RANDOM ranking (P, R, F summed).

Equivalence with the public functions composed (``separability``, ``sink_geometry``,
``sink_aware_bounds``, ``winner_sources``) is tested in ``tests/measure/test_layer_measures.py``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np
from numba import njit

from .bundles import LayerOutputs
from .certificates import certify, certify_rows, unit_weights
from .metrics import COS_EPS, Scratch, nosink_f, scratch, start, step, weighted_sizes, write_metrics
from .options import INLINE, NO_RC
from .random_stream import candidates, sample
from .rows import At, first_maximum, first_visible, scan_row, select

__all__ = ["layer_rows"]



class LayerScratch(NamedTuple):
    """A task's arrays: the metrics' :class:`~.metrics.Scratch`, the winner scores (and their
    bits), a variant's selection ``order``, the row's candidates (``cand_base``; ``cand`` the copy
    a draw permutes) and ``part`` ``[3, n]``: P, R, F of a NOSINK or RANDOM variant."""

    scratch: Scratch
    bits: np.ndarray
    scores: np.ndarray
    order: np.ndarray
    cand: np.ndarray
    cand_base: np.ndarray
    part: np.ndarray


@njit(**INLINE)
def _checks_and_votes(rows, rule, plan, at, ls, out):
    """The row's distribution checks (a failing real row counted in ``bad_rows``) and its vote
    (the winner among the visible keys); returns whether it is a real query."""
    b, h, t = at.b, at.h, at.t
    checks = out.checks
    total, negatives, visible = scan_row(rows.pattern, at, rows.key_mask, first_visible(rule.window, t), t + 1,
                                         rows.norms, ls.scores)
    checks.total[b, h, t], checks.negatives[b, h, t], checks.visible[b, h, t] = total, negatives, visible
    best = first_maximum(ls.scores, ls.bits, t + 1)
    if not rows.query_mask[b, t]:
        return False
    if (not math.isfinite(total) or negatives > 0 or abs(total - 1) > plan.tolerance
            or total - visible > plan.tolerance):
        out.tallies.bad_rows[b, h] += 1  # query_rows.check_distribution's conditions: it names the fault
    if (plan.taxonomy_all or t == rows.last[b]) and t > 0 and best >= 0:
        if best == t:
            out.tallies.votes[b, h, 0] += 1
        elif best == 0:
            out.tallies.votes[b, h, 1] += 1
        else:
            out.tallies.votes[b, h, 2] += 1
            out.tallies.offsets[b, h, t - best] += 1
    return True


@njit(**INLINE)
def _sink_standing(rows, values, rule, at, s, listed, sink):
    """The sink's mass and rank: the number of candidates ranked before it (those listed before it
    when it is listed; otherwise every visible key that outscores it, ties to the sink). A row
    whose window has left the sink behind has none (both stay NaN)."""
    b, h, kv, t, row, q = at.b, at.h, at.kv, at.t, at.row, at.out
    pattern, key_mask = rows.pattern, rows.key_mask
    if first_visible(rule.window, t) > 0:
        return
    sink.mass[b, h, q] = float(pattern[b, h, row, 0]) if key_mask[b, 0] else 0.0
    if listed >= 0:
        sink.rank[b, h, q] = listed
        return
    s0 = -math.inf
    if key_mask[b, 0]:
        s0 = float(pattern[b, h, row, 0])
        if rule.ranking == 1:
            s0 *= values.norms64[b, kv, 0]
    ahead = 0
    for k in range(1, t + 1):
        if not key_mask[b, k]:
            continue
        a = float(pattern[b, h, row, k])
        score = a if rule.ranking == 0 else a * values.norms64[b, kv, k]
        ahead += 1 if score > s0 else 0
    sink.rank[b, h, q] = ahead


@njit(**INLINE)
def _top(rows, values, rule, plan, at, s, n_cand, nosink_in_top, w_max, out):
    """Variant TOP: every metric of the ranking's own top-N sets; with the sink diagnostics the
    alignments (and NOSINK's F when the sink is an unselected candidate at every N: the same
    sets), with ``want_bounds`` the certificates."""
    b, h, kv, t, q = at.b, at.h, at.kv, at.t, at.out
    ns = rule.ns
    sink_rank = start(at, s, s.top_idx, n_cand, ns[ns.shape[0] - 1])
    for j in range(ns.shape[0]):
        n = ns[j]
        if n >= n_cand:
            break
        st = step(values, rule, at, s, s.top_idx, j, True, plan.want_bounds)
        write_metrics(out.metrics, at, j, st, sink_rank < n)
        if nosink_in_top and n < n_cand - 1:
            out.sink.f_nosink[b, h, q, j] = nosink_f(s, st, n)
        if plan.want_sink and first_visible(rule.window, t) == 0:  # a sink out of view: NaN
            out.sink.align_sink[b, h, q, j] = s.proj[0] / (st.agg_norm * math.sqrt(values.squares[b, kv, 0])
                                                           + COS_EPS)
        if plan.want_sink:
            out.sink.align_current[b, h, q, j] = s.proj[t] / (st.agg_norm * math.sqrt(values.squares[b, kv, t])
                                                              + COS_EPS)
        if plan.want_bounds:  # the theorems bound the same measurement: the largest bound holds
            p_gram, r_gram = certify(rows.certificates, 0, s.alpha, w_max[0], at, s, s.top_idx, n, n_cand)
            p_unit, r_unit = certify(rows.certificates, 1, s.omega, w_max[1], at, s, s.top_idx, n, n_cand)
            p_rows, r_rows = certify_rows(rows.certificates, values, rule, at, s, s.top_idx, j, n_cand)
            out.certificates.precision[b, h, q, j] = max(p_gram, p_unit, p_rows)
            out.certificates.recall[b, h, q, j] = max(r_gram, r_unit, r_rows)


@njit(**NO_RC)
def _unselect(s, order, m):
    """After a variant: its selected sources (candidates all) back to ``excluded = 0``."""
    for rank in range(m):
        s.excluded[order[rank]] = 0.0


@njit(**INLINE)
def _prf(values, rule, at, ls, n_cand, m):
    """P, R, F of the selection ``ls.order[:m]`` into ``ls.part`` (NaN where undefined), then the
    sources back to candidates."""
    s = ls.scratch
    ns = rule.ns
    for j in range(ns.shape[0]):
        ls.part[0, j] = ls.part[1, j] = ls.part[2, j] = np.nan
    start(at, s, ls.order, n_cand, 0)
    for j in range(ns.shape[0]):
        if ns[j] >= n_cand:
            break
        st = step(values, rule, at, s, ls.order, j, False, False)
        ls.part[0, j], ls.part[1, j], ls.part[2, j] = st.precision, st.recall, st.f
    _unselect(s, ls.order, m)


@njit(**INLINE)
def _nosink(rows, values, rule, at, ls, n_cand, filled, out):
    """Variant NOSINK: TOP's list without key 0 (an unselected candidate), with key 0 out of the
    candidates; F only."""
    b, h, q = at.b, at.h, at.out
    s = ls.scratch
    max_n = rule.ns[rule.ns.shape[0] - 1]
    m = 0
    for rank in range(filled):
        if s.top_idx[rank] != 0 and m < max_n:
            ls.order[m] = s.top_idx[rank]
            m += 1
    sink_alpha, sink_size = s.alpha[0], s.y_size[0]
    s.alpha[0] = s.y_size[0] = 0.0
    s.excluded[0] = math.inf
    _prf(values, rule, at, ls, n_cand - 1 if rows.key_mask[b, 0] else n_cand, m)
    for j in range(rule.ns.shape[0]):
        out.sink.f_nosink[b, h, q, j] = ls.part[2, j]
    s.alpha[0], s.y_size[0] = sink_alpha, sink_size
    s.excluded[0] = 0.0 if rows.key_mask[b, 0] else math.inf


@njit(**INLINE)
def _random(rows, values, rule, plan, at, ls, out):
    """Variant RANDOM: P, R, F of ``plan.n_random`` random rankings, summed; the row's
    candidates listed once."""
    b, h, t, q = at.b, at.h, at.t, at.out
    n_cand = candidates(rows.key_mask, b, first_visible(rule.window, t), t, rule.exclude_sink, ls.cand_base)
    m = min(rule.ns[rule.ns.shape[0] - 1], n_cand)
    for r in range(plan.n_random):
        for k in range(n_cand):
            ls.cand[k] = ls.cand_base[k]
        sample(ls.cand, n_cand, m, rows.random_keys[b], h, t, r, ls.order)
        _prf(values, rule, at, ls, n_cand, m)
        for j in range(rule.ns.shape[0]):
            if not np.isnan(ls.part[0, j]):
                for i in range(3):
                    out.tallies.random_sum[i, b, h, q, j] += ls.part[i, j]


@njit(**INLINE)
def _measure(rows, values, rule, plan, at, ls, out):
    """Every variant of one measured row. TOP's list keeps one source more than max N: without
    the sink it is NOSINK's."""
    s = ls.scratch
    max_n = rule.ns[rule.ns.shape[0] - 1]
    n_cand, filled = select(rows.pattern, rows.pattern, at, rows.key_mask, values.norms64, rule, max_n + 1, s)
    listed = -1  # the sink's place in TOP's list, where it is a listed candidate
    for rank in range(filled if not rule.exclude_sink else 0):
        if s.top_idx[rank] == 0:
            listed = rank
    if plan.want_sink:
        _sink_standing(rows, values, rule, at, s, listed, out.sink)
    sink_candidate = not rule.exclude_sink and rows.key_mask[at.b, 0] and first_visible(rule.window, at.t) == 0
    nosink_in_top = plan.want_sink and sink_candidate and not 0 <= listed < max_n
    weighted_sizes(values, rule, at, s)  # shared by every variant of the row
    w_max = unit_weights(values, at, s) if plan.want_bounds else (0.0, 0.0)
    _top(rows, values, rule, plan, at, s, n_cand, nosink_in_top, w_max, out)
    _unselect(s, s.top_idx, min(filled, max_n))
    if plan.want_sink and not sink_candidate:  # NOSINK is TOP
        b, h, q = at.b, at.h, at.out
        for j in range(rule.ns.shape[0]):
            out.sink.f_nosink[b, h, q, j] = out.metrics.f[b, h, q, j]
    elif plan.want_sink and not nosink_in_top:
        _nosink(rows, values, rule, at, ls, n_cand, filled, out)
    if plan.n_random:
        _random(rows, values, rule, plan, at, ls, out)


@njit(**NO_RC)
def _task(rows, values, rule, plan, b, h, ls, out):
    """The rows of one (sequence, head): no reference counting (see docs/design.md, "The engine")."""
    kv = h // rule.group
    last = rows.last[b]
    every = plan.geometry_all or plan.taxonomy_all
    for t in range(0 if every else last, rows.pattern.shape[2] if every else last + 1):
        # Keys 0..t only: a causal model's later entries are the softmax's exact zeros, and
        # mass there would leave these sums short of 1 (refused). Halves the bytes read.
        at = At(b, h, kv, t, t, t if plan.geometry_all else 0)
        if _checks_and_votes(rows, rule, plan, at, ls, out) and (plan.geometry_all or t == last):
            _measure(rows, values, rule, plan, at, ls, out)


@njit(cache=True, nogil=True)
def _scratch(rows, values, rule, plan):
    """A task's :class:`LayerScratch`."""
    n_k = rows.pattern.shape[3]
    max_n = rule.ns[rule.ns.shape[0] - 1]
    bits = np.zeros(n_k, dtype=plan.bits_like.dtype)
    return LayerScratch(scratch(n_k, values.vectors.shape[3], max_n + 1), bits, bits.view(rows.pattern.dtype),
                        np.zeros(max_n, dtype=np.int64), np.zeros(n_k, dtype=np.int64), np.zeros(n_k, dtype=np.int64),
                        np.zeros((3, rule.ns.shape[0])))


@njit(parallel=True, cache=True, nogil=True)
def layer_rows(rows, values, rule, plan, metrics, checks, sink, certificates, tallies):
    """Fill the outputs (:class:`~.bundles.LayerOutputs`' parts, pre-filled with NaN / False / 0)
    for every row of ``rows.pattern``, one task per (sequence, head) (:class:`~.bundles.LayerRows`,
    :class:`~.bundles.Values`, :class:`~.bundles.Rule`, :class:`~.bundles.LayerPlan`). Per-N
    outputs ``[batch, head, q, n]`` have ``q`` = every query (geometry at all) or 1 (the last)."""
    n_heads = rows.pattern.shape[1]
    for task in numba.prange(rows.pattern.shape[0] * n_heads):
        out = LayerOutputs(metrics, checks, sink, certificates, tallies)
        _task(rows, values, rule, plan, task // n_heads, task % n_heads, _scratch(rows, values, rule, plan), out)
