"""The certificates of one row's top-N sets: lower bounds on P and R that the measured values
provably reach under the working dtype's rounding (docs/theory.md: Theorems 1 and 2 from the
layer's Gram bounds, Theorems 3 and 4 from the set's own statistics, the slacks of Lemma 3).

Called after :func:`.metrics.step` of the same set, on the same :class:`~.metrics.Scratch`.
"""

from __future__ import annotations

import math

from numba import njit

from .metrics import bits_minimum
from .options import INLINE, NO_RC

__all__ = ["unit_weights", "certify", "certify_rows"]

_LOWEST = -1.7976931348623157e308


@njit(**NO_RC)
def _certified_lower(lower, a, mass, slack_w, slack_64, slack_abs, selected_error):
    """An unselected source's ``L_j`` less its slack σ_j (docs/theory.md, Lemma 3): the value to
    compare with ``max U_i``. ``-max`` (counted outside, and no selected source certified
    inside) unless ``L_j`` exceeds its slack τ_j, which proves that the measured ``D_j²`` is
    positive (the measurement clamps negative ones)."""
    return _certified_gap(lower, 0.0, a, mass, slack_w, slack_64, slack_abs, selected_error)


@njit(**NO_RC)
def _certified_gap(gap, s_sq_lo, a, mass, slack_w, slack_64, slack_abs, selected_error):
    """Theorem 4's ``F_j`` (``gap``) less the slack σ_j of Lemma 3, or ``-max`` unless ``F_j + s_sq_lo``
    (``s_sq_lo`` a lower bound on ``‖s‖²``) exceeds its slack τ_j (Lemma 6); with ``s_sq_lo = 0`` an
    ``L_j`` itself."""
    own_error = slack_w * (a * a + 2 * a * mass)
    spread = a + mass
    exact_error = slack_64 * spread * spread + slack_abs
    positive = gap + s_sq_lo - own_error - slack_w * mass * mass - exact_error > 0.0
    certified = gap - own_error - selected_error - exact_error
    return certified if positive else _LOWEST  # a select, not a branch: the loop over keys vectorises


@njit(**NO_RC)
def _model_holds(slack_w, slack_64, err, slack_abs):
    """Whether the row's slacks are finite: where Lemma 3's rounding model breaks (``m·u ≥ 1``) the
    table holds +inf and the certificate is the trivial bound (fail closed)."""
    return math.isfinite(slack_w + slack_64 + err + slack_abs)


@njit(**NO_RC)
def _trivial(n, n_cand):
    """The trivial bound: every unselected candidate counted outside, no selected source inside."""
    return n / (n + (n_cand - n)), 0.0


@njit(**NO_RC)
def _out_of_reach(lower_0, s_sq_lo, diag_lo, inner, w_max, u_min):
    """Whether no unselected source can reach the smallest ``U_i``: then every one is counted and
    none certified inside, the trivial bound, without a pass over the keys. A non-sink ``L_j`` before
    its slack, ``w²·diag_lo + s_sq_lo − 2w·inner``, is convex in its weight ``w ∈ [0, w_max]``, so at
    most its value at an end, plus the rounding of evaluating it at any ``w`` (16 ulps of its terms'
    sizes); the sink's is ``lower_0`` (-inf when it is no unselected candidate). A slack only
    lowers them."""
    size = w_max * w_max * diag_lo + abs(s_sq_lo) + 2 * w_max * abs(inner)
    top = max(s_sq_lo, w_max * w_max * diag_lo + s_sq_lo - 2 * w_max * inner) + 16 * 2.0**-53 * size
    return max(top, lower_0) < u_min


@njit(**NO_RC)
def _selected_weights(alpha, order, n):
    """W and Q of the selected non-sink weights, the selected sink's w_0, the largest selected
    weight: Theorem 1's inputs (the slacks of Lemma 3 scale with them)."""
    w0 = 0.0
    total = 0.0
    sum_sq = 0.0
    a_max = 0.0
    for rank in range(n):
        i = order[rank]
        a_max = max(a_max, alpha[i])
        if i == 0:
            w0 = alpha[0]
        else:
            total += alpha[i]
            sum_sq += alpha[i] * alpha[i]
    return w0, total, sum_sq, a_max


@njit(**INLINE)
def unit_weights(values, at, s):
    """``s.omega[k] = α_k‖v_k‖`` for keys ``0..t``: Theorem 2's weights on the unit vectors
    (``values.norms64``: the layer's float64 norms); returns the largest α and ω over keys ``1..t``."""
    b, kv, t = at.b, at.kv, at.t
    s.omega[0] = s.alpha[0] * values.norms64[b, kv, 0]
    alpha_max = omega_max = 0.0
    for k in range(1, t + 1):
        s.omega[k] = s.alpha[k] * values.norms64[b, kv, k]
        alpha_max = max(alpha_max, s.alpha[k])
        omega_max = max(omega_max, s.omega[k])
    return alpha_max, omega_max


@njit(**INLINE)
def certify(cert, form, weights, w_max, at, s, order, n, n_cand):
    """The certificates (P, R lower bounds) of the top-N set ``order[:n]`` among ``n_cand``
    candidates: Theorem 1 from the Gram bounds ``cert[form, :, b, kv, t]``
    (``certificates.CERTIFICATE_KEYS``; form 0 on α and v, form 1 Theorem 2 on ω and the unit vectors)
    and the ``weights`` of that form (``w_max`` their largest over keys ``1..t``). Overwrites
    ``s.u_val`` (with ``U_i = Q⁺(w^S − α_i e_i)``) and ``s.dist`` (with the certified ``L_j``)."""
    b, kv, t = at.b, at.kv, at.t
    g = cert[form]
    diag_lo, diag_hi, pair_hi, pair_lo = g[0, b, kv, t], g[1, b, kv, t], g[2, b, kv, t], g[3, b, kv, t]
    sink_hi, sink_lo, sink_sq = g[4, b, kv, t], g[5, b, kv, t], g[6, b, kv, t]
    slack_w, slack_64, slack_abs = g[7, b, kv, t], g[8, b, kv, t], g[10, b, kv, t]
    if not _model_holds(slack_w, slack_64, g[9, b, kv, t], slack_abs):
        return _trivial(n, n_cand)
    w0, total, sum_sq, a_max = _selected_weights(weights, order, n)
    mass = total + w0
    u_max = -math.inf
    u_min = math.inf
    for rank in range(n):
        i = order[rank]
        own = 0.0 if i == 0 else weights[i]
        s_w = 0.0 if i == 0 else w0
        q_sq = sum_sq - own * own
        q_tot = total - own
        s.u_val[rank] = (diag_hi * q_sq + pair_hi * (q_tot * q_tot - q_sq) + sink_sq * s_w * s_w
                         + 2 * sink_hi * s_w * q_tot)
        u_max = max(u_max, s.u_val[rank])
        u_min = min(u_min, s.u_val[rank])
    s_sq_lo = max(diag_lo * sum_sq + pair_lo * (total * total - sum_sq) + sink_sq * w0 * w0
                  + 2 * sink_lo * w0 * total, 0.0)
    selected_error = slack_w * (a_max * a_max + 2 * a_max * mass)
    inner = pair_hi * total + sink_hi * w0
    a = weights[0]
    lower_0 = a * a * sink_sq + s_sq_lo - 2 * a * (sink_hi * total) if s.excluded[0] == 0.0 else -math.inf
    if _out_of_reach(lower_0, s_sq_lo, diag_lo, inner, w_max, u_min):
        return _trivial(n, n_cand)  # every unselected candidate counted, none inside: the pass below's result
    outside = 0  # +inf (excluded) drops selected and non-candidates from the count and minimum
    for k in range(1, t + 1):
        a = weights[k]
        value = _certified_lower(a * a * diag_lo + s_sq_lo - 2 * a * inner, a, mass, slack_w, slack_64, slack_abs,
                                 selected_error) + s.excluded[k]
        s.dist[k] = value
        outside += 0 if value > u_max else 1  # NaN-safe: counted unless certified beyond
    if s.excluded[0] == 0.0:  # the unselected sink: its own norm and Gram bounds
        s.dist[0] = _certified_lower(lower_0, weights[0], mass, slack_w, slack_64, slack_abs, selected_error)
    else:
        s.dist[0] = math.inf
    outside += 0 if s.dist[0] > u_max else 1
    return _bounds(s, s.u_val, s.dist_bits, t, n, outside)


@njit(**NO_RC)
def _upper_max(upper, n):
    """``max upper[:n]``, NaN when any is NaN (a float ``max`` would pass over it)."""
    largest = -math.inf
    for rank in range(n):
        x = upper[rank]
        largest = x if not x <= largest else largest
    return largest


@njit(**NO_RC)
def _bounds(s, upper, lower_bits, t, n, outside):
    """P̲ and R̲ from the unselected sources counted (``outside``), the selected ``U_i`` (or ``E_i``)
    in ``upper[:n]`` and the certified ``L_j`` (or ``F_j``) whose int64 views are
    ``lower_bits[:t + 1]`` (+inf off the unselected)."""
    inside = n  # no L_j ≤ max U_i (and max U_i a number): every selected source is certified inside
    if outside > 0 or not math.isfinite(_upper_max(upper, n)):
        l_min = bits_minimum(s, lower_bits, 0, t + 1)
        inside = 0
        for rank in range(n):
            inside += 1 if upper[rank] < l_min else 0
    return n / (n + outside), inside / n


@njit(**NO_RC)
def _grow_pairs(gram, b, kv, order, lo, hi, pair_range, pair_min):
    """Theorem 3's ``pair_range`` after adding the sources ``order[lo:hi]`` (the largest and
    smallest ``Ĝ[i, l]`` over a new source ``i`` and each source ``l`` ranked before it) and
    Theorem 4's ``pair_min`` (each rank's smallest ``Ĝ`` with another selected source)."""
    largest, smallest = (-math.inf, math.inf) if lo == 0 else (pair_range[0], pair_range[1])
    if lo == 0:
        pair_min[0] = math.inf
    for rank in range(max(lo, 1), hi):
        i = order[rank]
        own = math.inf
        # locals, not the arrays: stores to pair_min could alias them and keep the loop scalar
        for earlier in range(rank):
            x = float(gram[b, kv, i, order[earlier]])
            largest = max(largest, x)
            smallest = min(smallest, x)
            own = min(own, x)
            pair_min[earlier] = min(pair_min[earlier], x)
        pair_min[rank] = own
    pair_range[0], pair_range[1] = largest, smallest


@njit(**INLINE)
def certify_rows(cert, values, rule, at, s, order, j, n_cand):
    """Theorems 3 and 4's certificates of the top-N set ``order[:n]``, ``n = rule.ns[j]``, the
    larger of each: Lemma 2 with the row's own statistics (exact ``‖v_k‖²``, ``s.pair_range`` and
    ``s.reach``, read from the working-dtype Gram matrix and widened by ``gram_err``, Lemma 5), and
    the compared form ``e_k = D_k² − ‖s‖²`` bounded by ``E_i`` (with ``s.pair_min``) and ``F_j``
    (Theorem 4, Lemma 6); Theorem 1's slacks. Theorem 4 can only lose to Theorem 3 where the lower
    bound on ``‖s‖²`` is clamped at 0 (docs/theory.md), so only such rows pay for Theorem 3's
    counts. Called for ``j = 0, 1, …`` in turn after :func:`step` with ``reach`` (which grows
    ``s.reach``): it grows ``s.pair_range`` and ``s.pair_min`` from ``rule.ns[j - 1]``. Overwrites
    ``s.u_val``, ``s.e_val``, ``s.dist`` and ``s.gaps``."""
    b, kv, t = at.b, at.kv, at.t
    g = cert[0]
    slack_w, slack_64, err, slack_abs = g[7, b, kv, t], g[8, b, kv, t], g[9, b, kv, t], g[10, b, kv, t]
    n = rule.ns[j]
    _grow_pairs(values.gram, b, kv, order, rule.ns[j - 1] if j > 0 else 0, n, s.pair_range, s.pair_min)
    if not _model_holds(slack_w, slack_64, err, slack_abs):
        return _trivial(n, n_cand)
    total_size = mass = sum_sq = a_max = 0.0
    for rank in range(n):
        i = order[rank]
        a = s.alpha[i]
        total_size += a * a * values.squares[b, kv, i]
        mass += a
        sum_sq += a * a
        a_max = max(a_max, a)
    pair_hi = s.pair_range[0] + err if n > 1 else 0.0
    pair_lo = s.pair_range[1] - err if n > 1 else 0.0
    s_sq = total_size + pair_lo * (mass * mass - sum_sq)
    clamped = not s_sq > 0.0
    s_sq_lo = max(s_sq, 0.0)
    u_max = e_max = -math.inf
    e_min = math.inf
    for rank in range(n):
        i = order[rank]
        a = s.alpha[i]
        size = a * a * values.squares[b, kv, i]
        # E_i = −α_i²q_i − 2α_i(W − α_i)·min_{k∈S∖i} G_ik (one source: e_i = −‖s‖² exactly)
        s.e_val[rank] = -size - 2 * a * (mass - a) * (s.pair_min[rank] - err) if n > 1 else -size
        e_max = max(e_max, s.e_val[rank])
        e_min = min(e_min, s.e_val[rank])
        if clamped:
            s.u_val[rank] = (total_size - size) + pair_hi * ((mass - a) * (mass - a) - (sum_sq - a * a))
            u_max = max(u_max, s.u_val[rank])
    selected_error = slack_w * (a_max * a_max + 2 * a_max * mass)
    # D_j² > 0 from Theorem 3's L_j, or from ‖s‖² ≥ −e_i ≥ −E_i for every selected i (Lemma 6)
    s_sq_positive = max(s_sq_lo, -e_min)
    outside = 0
    for k in range(t + 1):
        a = s.alpha[k]
        gap = a * a * values.squares[b, kv, k] - 2 * a * mass * (s.reach[k] + err)  # F_j ≤ e_j
        value = _certified_gap(gap, s_sq_positive, a, mass, slack_w, slack_64, slack_abs, selected_error) + s.excluded[k]
        s.gaps[k] = value
        outside += 0 if value > e_max else 1
    p_gaps, r_gaps = _bounds(s, s.e_val, s.gaps_bits, t, n, outside)
    if not clamped:
        return p_gaps, r_gaps
    outside = 0
    for k in range(t + 1):
        a = s.alpha[k]
        lower = a * a * values.squares[b, kv, k] - 2 * a * mass * (s.reach[k] + err) + s_sq_lo  # L_j ≤ D_j²
        value = _certified_lower(lower, a, mass, slack_w, slack_64, slack_abs, selected_error) + s.excluded[k]
        s.dist[k] = value
        outside += 0 if value > u_max else 1
    p_rows, r_rows = _bounds(s, s.u_val, s.dist_bits, t, n, outside)
    return max(p_rows, p_gaps), max(r_rows, r_gaps)
