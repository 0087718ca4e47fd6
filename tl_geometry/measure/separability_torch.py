"""The torch separability backend (any device): vectorised over batch, heads and a chunk of queries.

Per N two skinny matmuls per query chunk (``s_N = (α·1_S) V`` and ``V s_N``), one ``topk`` per
row, inversions by ``searchsorted``. Takes a :class:`~tl_geometry.measure.separability_job.SeparabilityJob`
and returns :class:`~tl_geometry.measure.separability_job.MetricFields`, as the numba backend does.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .query_rows import check_rows, gather_rows
from .selection import (
    COS_EPS,
    precision_from_outside,
    selection_scores,
    top_order,
    value_norms64,
    visible_sources,
)
from .separability_job import MetricFields, SeparabilityJob

__all__ = ["separability_torch", "CHUNK_ELEMENTS"]

# Elements of one [batch, head, query-chunk, key] working tensor; bounds peak memory.
CHUNK_ELEMENTS = 1 << 19
# Below this N a few broadcast comparisons beat a binary search.
_COMPARE_BELOW_N = 4
_METRIC_FIELDS = ("precision", "recall", "f", "margin", "inversions")


def separability_torch(job: SeparabilityJob, *, chunk_elements: int = CHUNK_ELEMENTS) -> MetricFields:
    """The metrics of ``job`` in query chunks of ``[batch, head, chunk, key]`` tensors, with at
    most ``chunk_elements`` elements each."""
    pattern, ns, ranking, qpos, dtype = job.pattern, job.ns, job.ranking, job.qpos, job.dtype
    batch, heads, n_q, n_k = pattern.shape
    device = pattern.device
    n_sel = qpos.shape[1]
    group = job.group
    values = job.v.to(dtype).permute(0, 2, 1, 3).contiguous()  # [batch, kv, key, d]
    value_sq = values.pow(2).sum(-1)  # [batch, kv, key]
    value_norm = value_sq.sqrt()
    value_norm64 = value_norms64(values) if isinstance(ranking, str) and ranking == "contribution" else None

    out = {name: torch.full((batch, heads, n_sel, len(ns)), torch.nan, dtype=dtype, device=device)
           for name in _METRIC_FIELDS}
    sink_selected = torch.zeros(batch, heads, n_sel, len(ns), dtype=torch.bool, device=device)

    chunk = max(1, chunk_elements // max(1, batch * heads * n_k))
    ar_full = torch.arange(n_k, device=device)
    for start in range(0, n_sel, chunk):
        q = qpos[:, start:start + chunk]  # [batch, c]
        sl = slice(start, start + q.shape[1])
        rows = (pattern[:, :, sl] if job.all_rows else gather_rows(pattern, q)).to(dtype)
        q_valid = job.query_mask.gather(1, q)  # [batch, c]
        # Causal queries see keys up to t only: work on the keys the chunk's latest query can see.
        k_hi = int(q.max()) + 1
        ar_k = ar_full[:k_hi]
        visible = visible_sources(job.key_mask[:, :k_hi], q, job.window) & q_valid[:, :, None]
        cand = visible & (ar_k != 0) if job.exclude_sink else visible
        cand = cand[:, None].expand(batch, heads, -1, k_hi)
        alpha = torch.where(visible[:, None], rows[..., :k_hi], 0.0)
        check_rows(rows, alpha.sum(-1), q_valid, pattern.dtype)
        if job.exclude_sink:
            alpha[..., 0] = 0.0
        # rows of the chosen queries (a score tensor was gathered by the caller)
        chunk_ranking = ranking[:, :, sl, :k_hi] if isinstance(ranking, Tensor) else ranking
        score = selection_scores(alpha, cand, chunk_ranking, None if value_norm64 is None else value_norm64[..., :k_hi],
                                 group)
        order = top_order(score, min(max(ns), k_hi))
        n_cand = cand.sum(-1, dtype=torch.int32)  # [batch, head, c]; candidates hold ranks 0..n_cand-1

        metrics = _chunk_metrics(alpha, order, cand, n_cand, values[:, :, :k_hi], value_sq[..., :k_hi],
                                 value_norm[..., :k_hi], ns, group, job.distance)
        for name, value in metrics.items():
            (sink_selected if name == "sink_selected" else out[name])[:, :, sl] = value
    return MetricFields(**out, sink_selected=sink_selected)


def _chunk_metrics(alpha, order, cand, n_cand, values, value_sq, value_norm, ns, group, distance):
    """All metrics of one query chunk; working tensors are [batch, head, c, key].

    Few passes over the [.., key] tensors per N. Top-N sets are nested, so the selection weights
    grow by a scatter per N and ``s_N`` is one skinny matmul. Euclidean
    comparisons use ``‖y‖² − 2⟨y, s_N⟩``, the squared distance less the row constant ``‖s_N‖²``
    (same order; only the radii add it back). After the N selected distances are gathered,
    selected sources (like non-candidates) are set to +inf, so with
    ``r_j = #{i∈S: D_i < D_j}`` (a searchsorted into the N sorted selected distances):
    ``#{j∉S: D_j ≤ ρ_max} = #{j: r_j < N}`` and ``GInv = Σ_j (N − r_j)``, where +inf entries
    contribute nothing.
    """
    batch, heads, c, n_k = alpha.shape
    kv = values.shape[1]
    values = values.contiguous()
    noncand = torch.zeros_like(alpha).masked_fill_(~cand, torch.inf)  # +inf on non-candidates
    a5 = alpha.view(batch, kv, group, c, n_k)
    if distance == "euclidean":
        base = (a5.pow(2) * value_sq[:, :, None, None, :]).view(batch, heads, c, n_k) + noncand  # ‖y‖² (+inf)
    else:
        y_norm = (a5 * value_norm[:, :, None, None, :]).view(batch, heads, c, n_k)
    nan = torch.full((batch, heads, c), torch.nan, dtype=alpha.dtype, device=alpha.device)
    results = {name: [] for name in ("precision", "recall", "f", "margin", "inversions", "sink_selected")}

    top_max = order[..., :min(max(ns), n_k)]
    alpha_top = alpha.gather(-1, top_max)
    weights = torch.zeros_like(alpha)  # α on the selected sources, 0 elsewhere; grows with N

    for n_value in ns:
        defined = n_cand > n_value  # at least one unselected candidate
        if n_value >= n_k:  # more selected than keys in this chunk: undefined everywhere
            for name in results:
                results[name].append(torch.zeros_like(defined) if name == "sink_selected" else nan)
            continue
        top = top_max[..., :n_value]
        weights.scatter_(-1, top, alpha_top[..., :n_value])  # nested sets: only adds sources
        agg = weights.view(batch, kv, group * c, n_k) @ values  # s_N: [batch, kv, group·c, d]
        proj = (agg @ values.transpose(-1, -2)).view(batch, heads, c, n_k)  # ⟨v_k, s_N⟩
        agg_sq = agg.pow(2).sum(-1).view(batch, heads, c, 1)  # ‖s_N‖²
        if distance == "euclidean":  # D² − ‖s‖² = ‖y‖² − 2α⟨v, s⟩, never below −‖s‖² (D² ≥ 0)
            dist = torch.addcmul(base, proj, alpha, value=-2)
            dist = torch.maximum(dist, -agg_sq, out=dist)
            if n_value == 1:  # the selected point is the aggregate: D = 0 exactly, and its duplicates'
                dist.scatter_(-1, top, (-agg_sq).expand(-1, -1, -1, 1))
                _tie_duplicates(dist, alpha, values, top, cand, agg_sq, group)
        else:
            dist = 1 - proj * alpha / (y_norm * agg_sq.sqrt() + COS_EPS) + noncand
        sel_dist = dist.gather(-1, top)
        rho_max = sel_dist.amax(-1, keepdim=True)
        dist.scatter_(-1, top, torch.inf)  # selected sources drop out of the unselected statistics
        rho_min = dist.amin(-1, keepdim=True)
        inside = (sel_dist < rho_min).sum(-1, dtype=torch.int32)
        if n_value <= _COMPARE_BELOW_N:  # a few broadcast comparisons beat a binary search
            # Σ_j (N − r_j) = Σ_{i∈S} #{j: D_j ≤ D_i}; the largest D_i gives the outside count.
            counts = [(dist <= sel_dist[..., i:i + 1]).sum(-1, dtype=torch.int32) for i in range(n_value)]
            inversions = sum(counts)
            outside = (dist <= rho_max).sum(-1, dtype=torch.int32) if n_value > 1 else counts[0]
        else:
            below = torch.searchsorted(sel_dist.sort(-1).values, dist, right=False, out_int32=True)
            inversions = n_value * n_k - below.sum(-1, dtype=torch.int32)
            outside = (below < n_value).sum(-1, dtype=torch.int32)
        precision = precision_from_outside(n_value, outside.to(dist.dtype))
        recall = inside.to(dist.dtype) / n_value
        f = torch.where(recall > 0, 2 * precision * recall / (precision + recall), 0.0)
        if distance == "euclidean":
            margin = (rho_min + agg_sq).sqrt() - (rho_max + agg_sq).clamp_min(0).sqrt()
        else:
            margin = rho_min - rho_max
        for name, value in (("precision", precision), ("recall", recall), ("f", f),
                            ("margin", margin.squeeze(-1)), ("inversions", inversions.to(dist.dtype))):
            results[name].append(torch.where(defined, value, nan))
        results["sink_selected"].append((top == 0).any(-1) & defined)
    return {name: torch.stack(value, -1) for name, value in results.items()}



def _tie_duplicates(dist, alpha, values, top, cand, agg_sq, group) -> None:
    """Euclidean N = 1: an unselected candidate with the selected source's weight and value has its
    contribution, so its distance to ``s_1`` is 0 exactly: ``dist`` set to the selected one's
    ``-‖s‖²`` rather than left to rounding (the engine's ``metrics._tie_duplicates``, the same rule).
    Weights are screened first; values are compared only where they tie. Zero contributions tie
    exactly already."""
    a_top = alpha.gather(-1, top)
    same = cand & (alpha == a_top) & (a_top != 0)
    same.scatter_(-1, top, False)
    if not bool(same.any()):
        return
    b, h, q, k = same.nonzero(as_tuple=True)
    i = top[b, h, q, 0]
    equal = (values[b, h // group, k] == values[b, h // group, i]).all(-1)
    b, h, q, k = b[equal], h[equal], q[equal], k[equal]
    dist[b, h, q, k] = -agg_sq[b, h, q, 0]
