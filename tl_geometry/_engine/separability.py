"""The separability kernel: the top-N metrics of chosen query rows of any pattern (docs/metrics.md)."""

from __future__ import annotations

import numba
from numba import njit

from .metrics import scratch, start, step, weighted_sizes, write_metrics
from .options import NO_RC
from .rows import At, first_visible, scan_row, select

__all__ = ["separability_rows", "ROWS_PER_TASK"]

# Rows per parallel task: each task allocates its scratch arrays once.
ROWS_PER_TASK = 64


@njit(**NO_RC)
def _row(inputs, values, rule, at, s, metrics, checks):
    """One row: its checks, then (a real query) its selection and metrics at every defined N."""
    b, h, t, q = at.b, at.h, at.t, at.row
    checks.total[b, h, q], checks.negatives[b, h, q], checks.visible[b, h, q] = scan_row(
        inputs.rows, at, inputs.key_mask, first_visible(rule.window, t), inputs.rows.shape[3], values.norms64,
        s.dist[:0])  # no winner scores
    if not inputs.qvalid[b, q]:
        return
    ns = rule.ns
    n_cand, _ = select(inputs.rows, inputs.scores, at, inputs.key_mask, values.norms64, rule, ns[ns.shape[0] - 1], s)
    weighted_sizes(values, rule, at, s)
    sink_rank = start(at, s, s.top_idx, n_cand, ns[ns.shape[0] - 1])
    for j in range(ns.shape[0]):
        if ns[j] >= n_cand:  # no unselected candidate: undefined from here on
            break
        st = step(values, rule, at, s, s.top_idx, j, True, False)
        write_metrics(metrics, at, j, st, sink_rank < ns[j])


@njit(**NO_RC)
def _task(task, inputs, values, rule, s, metrics, checks):
    """The rows of one task (no reference counting: see docs/design.md, "The engine")."""
    n_batch, n_heads, n_q, _ = inputs.rows.shape
    for r in range(task * ROWS_PER_TASK, min(n_batch * n_heads * n_q, (task + 1) * ROWS_PER_TASK)):
        b = r // (n_heads * n_q)
        h = (r // n_q) % n_heads
        q = r % n_q
        _row(inputs, values, rule, At(b, h, h // rule.group, inputs.qpos[b, q], q, q), s, metrics, checks)


@njit(parallel=True, cache=True, nogil=True)
def separability_rows(inputs, values, rule, metrics, checks):
    """Fill ``metrics`` (pre-filled with NaN / False) and ``checks`` for every row of
    ``inputs.rows`` (:class:`~.bundles.SeparabilityRows`, :class:`~.bundles.Values`,
    :class:`~.bundles.Rule`, :class:`~.bundles.Metrics`, :class:`~.bundles.RowChecks`)."""
    n_batch, n_heads, n_q, n_k = inputs.rows.shape
    for task in numba.prange((n_batch * n_heads * n_q + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        s = scratch(n_k, values.vectors.shape[3], rule.ns[rule.ns.shape[0] - 1])
        _task(task, inputs, values, rule, s, metrics, checks)
