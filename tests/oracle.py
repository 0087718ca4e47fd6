"""Reference implementation of docs/metrics.md#separability: plain loops in float64, straight from the definitions.

Slow on purpose; the tests compare the vectorised metrics against it.
"""

from __future__ import annotations

import math

import torch


def oracle_separability(pattern, v, ns, *, distance="euclidean", ranking="attention", positions=None,
                        exclude_sink=False, key_mask=None, query_mask=None):
    """Return dict of float64 tensors [batch, head, len(positions), len(ns)] (NaN = undefined)."""
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
                sources = [i for i in range(t + 1) if key_mask[b, i] and not (exclude_sink and i == 0)]
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
