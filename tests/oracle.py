"""Reference implementation of docs/metrics.md#separability: plain loops in float64, straight from the definitions.

Slow on purpose; the tests compare the vectorised metrics against it.
"""

from __future__ import annotations

import math

import torch


def first_source(t, window):
    """The first position query t sees: t − window + 1 under a sliding window, else 0."""
    return 0 if window is None else max(0, t - window + 1)


def oracle_separability(pattern, v, ns, *, distance="euclidean", ranking="attention", positions=None,
                        exclude_sink=False, key_mask=None, query_mask=None, window=None):
    """Return dict of float64 tensors [batch, head, len(positions), len(ns)] (NaN = undefined).
    The sources of query t: real keys first_source(t, window)..t."""
    pattern = pattern.double()
    v = v.double()
    batch, heads, n_q, n_k = pattern.shape
    group = heads // v.shape[2]
    if key_mask is None:
        key_mask = torch.ones(batch, n_k, dtype=torch.bool)
    if query_mask is None:
        query_mask = torch.ones(batch, n_q, dtype=torch.bool)
    if positions is None:
        positions = [list(range(n_q))] * batch
    n_sel = len(positions[0])
    out = {name: torch.full((batch, heads, n_sel, len(ns)), math.nan, dtype=torch.float64)
           for name in ("precision", "recall", "f", "margin", "inversions", "sink_selected")}
    for b in range(batch):
        for h in range(heads):
            vh = v[b, :, h // group, :]
            for qi, t in enumerate(positions[b]):
                if not query_mask[b, t]:
                    continue
                sources = [i for i in range(first_source(t, window), t + 1)
                           if key_mask[b, i] and not (exclude_sink and i == 0)]
                alpha = pattern[b, h, t]
                if isinstance(ranking, torch.Tensor):
                    score = {i: float(ranking[b, h, t, i]) for i in sources}
                elif ranking == "contribution":
                    score = {i: float(alpha[i] * vh[i].norm()) for i in sources}
                else:
                    score = {i: float(alpha[i]) for i in sources}
                # higher score first; ties to the lower position
                ordered = sorted(sources, key=lambda i: (-score[i], i))
                y = {i: alpha[i] * vh[i] for i in sources}
                for ni, n in enumerate(ns):
                    if not 1 <= n < len(sources):
                        continue
                    chosen = set(ordered[:n])
                    s = sum((y[i] for i in chosen), torch.zeros_like(vh[0]))
                    d = {}
                    for i in sources:
                        if distance == "euclidean":
                            d[i] = float((y[i] - s).norm())
                        else:
                            d[i] = 1 - float(y[i] @ s) / (float(y[i].norm() * s.norm()) + 1e-12)
                    rest = [j for j in sources if j not in chosen]
                    rho_max = max(d[i] for i in chosen)
                    rho_min = min(d[j] for j in rest)
                    p = n / (n + sum(d[j] <= rho_max for j in rest))
                    r = sum(d[i] < rho_min for i in chosen) / n
                    f = 0.0 if r == 0 else 2 * p * r / (p + r)
                    ginv = sum(d[j] <= d[i] for i in chosen for j in rest)
                    for name, value in (("precision", p), ("recall", r), ("f", f), ("margin", rho_min - rho_max),
                                        ("inversions", ginv), ("sink_selected", float(0 in chosen))):
                        out[name][b, h, qi, ni] = value
    return out


def oracle_row_bounds(pattern, v, ns, *, exclude_sink=False, window=None, theorems=(3, 4)):
    """Theorems 3 and 4 of docs/theory.md in exact-as-float64 loops, without rounding slacks, the
    larger bound of the two: for each query t and top-N set S (attention ranking, ties to the lower
    position), Lemma 2 with the row's own statistics (exact ‖v_k‖², the range of ⟨v_k, v_l⟩ over the
    pairs of S and, for each unselected j, max_{k∈S} ⟨v_j, v_k⟩), and the compared form
    e_k = D_k² − ‖s‖² between E_i (with min_{k∈S∖i} ⟨v_i, v_k⟩) and F_j, where F_j counts only when
    Theorem 3's L_j > 0 or F_j − min_i E_i > 0 (as the code proves the measured D_j² positive,
    Lemma 6); ``theorems`` picks them.
    Returns (P̲, R̲) float64 tensors [batch, head, query, len(ns)] (NaN = undefined)."""
    pattern = pattern.double()
    v = v.double()
    batch, heads, n_q, _ = pattern.shape
    group = heads // v.shape[2]
    out_p = torch.full((batch, heads, n_q, len(ns)), math.nan, dtype=torch.float64)
    out_r = out_p.clone()
    for b in range(batch):
        for h in range(heads):
            vh = v[b, :, h // group, :]
            for t in range(n_q):
                sources = [i for i in range(first_source(t, window), t + 1) if not (exclude_sink and i == 0)]
                alpha = [float(a) for a in pattern[b, h, t]]
                ordered = sorted(sources, key=lambda i: (-alpha[i], i))
                gram = [[float(vh[k] @ vh[m]) for m in range(t + 1)] for k in range(t + 1)]
                for ni, n in enumerate(ns):
                    if not 1 <= n < len(sources):
                        continue
                    chosen = ordered[:n]
                    rest = [j for j in sources if j not in chosen]
                    pairs = [gram[k][m] for k in chosen for m in chosen if k != m]
                    g_hi, g_lo = (max(pairs), min(pairs)) if pairs else (0.0, 0.0)
                    mass = sum(alpha[k] for k in chosen)

                    def quadratic(members, pair, alpha=alpha, gram=gram):
                        w = sum(alpha[k] for k in members)
                        q = sum(alpha[k] ** 2 for k in members)
                        return sum(alpha[k] ** 2 * gram[k][k] for k in members) + pair * (w * w - q)

                    upper = [quadratic([k for k in chosen if k != i], g_hi) for i in chosen]
                    s_sq = max(quadratic(chosen, g_lo), 0.0)
                    lower = [alpha[j] ** 2 * gram[j][j] + s_sq - 2 * alpha[j] * mass * max(gram[j][k] for k in chosen)
                             for j in rest]
                    e_up = [-alpha[i] ** 2 * gram[i][i]
                            - (2 * alpha[i] * (mass - alpha[i]) * min(gram[i][k] for k in chosen if k != i) if n > 1
                               else 0.0) for i in chosen]
                    f_lo = [alpha[j] ** 2 * gram[j][j] - 2 * alpha[j] * mass * max(gram[j][k] for k in chosen)
                            for j in rest]
                    f_lo = [f if low > 0 or f - min(e_up) > 0 else -math.inf
                            for f, low in zip(f_lo, lower, strict=True)]
                    bounds = {3: (upper, lower), 4: (e_up, f_lo)}
                    out_p[b, h, t, ni] = max(n / (n + sum(x <= max(bounds[k][0]) for x in bounds[k][1])) for k in theorems)
                    out_r[b, h, t, ni] = max(sum(u < min(bounds[k][1]) for u in bounds[k][0]) for k in theorems) / n
    return out_p, out_r


def assert_same_separability(a, b, atol=1e-12):
    """Two :class:`Separability` results equal (NaN where undefined in both)."""
    for name in ("precision", "recall", "f", "margin", "inversions"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), equal_nan=True, atol=atol, rtol=0, msg=name)
    assert torch.equal(a.sink_selected, b.sink_selected)
