"""One attention row: its checks, its selection by a ranking and its winner.

A row is addressed by an :class:`At`: sequence, query head, kv head, query position, the row's
index on the pattern's query axis and its index on the outputs' query axis.
Keys are offered to the selection in decreasing position: recent keys usually carry more
weight, so fewer are inserted.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from numba import njit

from .options import INLINE, NO_RC, SUMS

__all__ = ["At", "first_visible", "insert_top", "scan_row", "select", "first_maximum", "BLOCK"]

# Keys per block of the winner search.
BLOCK = 16


class At(NamedTuple):
    """Where a row is: sequence ``b``, query head ``h``, kv head ``kv``, query position ``t``, the
    row's index ``row`` on the pattern's query axis and ``out`` on the outputs' query axis."""

    b: int
    h: int
    kv: int
    t: int
    row: int
    out: int


@njit(**NO_RC)
def first_visible(window, t):
    """The first key query ``t`` sees: ``t − window + 1`` in a sliding-window layer (``window`` > 0),
    else 0 (the whole causal prefix). The visible keys of a row are ``first_visible .. t``, real."""
    return max(0, t - window + 1) if window > 0 else 0


@njit(**NO_RC)
def insert_top(top_idx, top_score, filled, m, k, score):
    """Offer key ``k`` to the best-``m`` list (score descending, ties to the lower position);
    returns the new length. Keys come in decreasing position, so ``k`` wins ties against every
    listed key."""
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


@njit(fastmath=SUMS, **NO_RC)
def scan_row(rows, at, key_mask, lo, n_keys, norms, scores):
    """Over keys ``0..n_keys-1`` of the row: its sum (float64; NaN and inf propagate), its
    number of negative entries and its mass on the visible keys (``lo..t``, real). Where
    ``scores`` is not empty, in the same pass, the winner scores ``α_k‖v_k‖`` of keys ``0..t``
    (the pattern's dtype; ``norms[b, kv]``; -1 off the visible keys) for :func:`first_maximum`:
    the row is read once."""
    b, h, kv, t, row = at.b, at.h, at.kv, at.t, at.row
    total = 0.0
    visible = 0.0
    negatives = 0
    n_visible = min(t + 1, n_keys)
    want_scores = scores.shape[0] > 0
    for k in range(min(lo, n_visible)):  # before a sliding window: in the sum only
        fa = float(rows[b, h, row, k])
        total += fa
        negatives += 1 if fa < 0 else 0
        if want_scores:
            scores[k] = -1.0
    for k in range(min(lo, n_visible), n_visible):
        a = rows[b, h, row, k]
        fa = float(a)
        total += fa
        visible += fa if key_mask[b, k] else 0.0
        negatives += 1 if fa < 0 else 0
        if want_scores:
            scores[k] = a * norms[b, kv, k] if key_mask[b, k] else -1.0
    for k in range(n_visible, n_keys):
        a = float(rows[b, h, row, k])
        total += a
        negatives += 1 if a < 0 else 0
    return total, negatives, visible


@njit(**INLINE)
def select(rows, scores, at, key_mask, norms64, rule, m, s):
    """The row's weights ``s.alpha`` (0 off the candidates), candidate flags ``s.excluded`` (0 for
    a candidate, +inf otherwise: added to a distance it drops the key from every statistic
    without a branch) and its best-``m`` candidates ``s.top_idx`` by the ranking (``scores``
    ``[batch, head, q, key]`` read for ranking 2 only); returns (candidates, listed). Candidates
    are the visible keys (:func:`first_visible` ``.. t``, real), less key 0 with ``exclude_sink``."""
    b, h, kv, t, row = at.b, at.h, at.kv, at.t, at.row
    alpha, excluded, top_idx, top_score = s.alpha, s.excluded, s.top_idx, s.top_score
    exclude_sink, ranking = rule.exclude_sink, rule.ranking
    n_cand = 0
    filled = 0
    lo = first_visible(rule.window, t)
    m = min(m, t + 1 - lo)
    for k in range(lo):  # before the window: no weight, never a candidate
        alpha[k] = 0.0
        excluded[k] = math.inf
    for k in range(t, lo - 1, -1):
        a = float(rows[b, h, row, k])
        candidate = key_mask[b, k] and not (exclude_sink and k == 0)
        alpha[k] = a if candidate else 0.0
        excluded[k] = 0.0 if candidate else math.inf
        if not candidate:
            continue
        n_cand += 1
        if ranking == 0:
            score = a
        elif ranking == 1:
            score = a * norms64[b, kv, k]
        else:  # -inf is still a candidate: above every non-candidate
            score = max(float(scores[b, h, row, k]), -1.7976931348623157e308)
        filled = insert_top(top_idx, top_score, filled, m, k, score)
    return n_cand, filled


@njit(**NO_RC)
def first_maximum(scores, bits, n):
    """The winner: the first position of the largest of ``scores[:n]`` (from :func:`scan_row`;
    -1 when none is ≥ 0). ``bits`` is ``scores`` viewed as same-width integers: scores ≥ 0 (-0
    made +0) order as their bit patterns do, so the maximum and the search are integer loops
    that LLVM vectorises (a float maximum is a serial chain it does not)."""
    for k in range(n):  # -0 to +0 (a pass of its own: LLVM vectorises it)
        scores[k] = scores[k] + 0.0
    best = -1
    for k in range(n):
        best = max(best, bits[k])
    if best < 0:
        return -1
    n_w = n - n % BLOCK
    for k0 in range(0, n_w, BLOCK):
        hits = 0
        for e in range(BLOCK):
            hits += 1 if bits[k0 + e] == best else 0
        if hits:
            for k in range(k0, k0 + BLOCK):
                if bits[k] == best:
                    return k
    for k in range(n_w, n):
        if bits[k] == best:
            return k
    return -1
