"""The numba separability backend (CPU): the engine's separability kernel over blocks.

Values are prepared once per call (kv-head layout, float64 squared norms, and when many query
rows read them one Gram matrix ``V Vᵀ`` per kv head, in blocks that bound the extra memory).
Takes a :class:`~tl_geometry.measure.separability_job.SeparabilityJob` and returns
:class:`~tl_geometry.measure.separability_job.MetricFields`, as the torch backend does.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import _engine as engine
from .query_rows import check_distribution, gather_rows
from .separability_job import MetricFields, SeparabilityJob, block_grams

__all__ = ["separability_numba"]


def separability_numba(job: SeparabilityJob, *, gram_cache: dict | None = None) -> MetricFields:
    """The metrics of ``job`` (CPU tensors); calls on the same values may share ``gram_cache``."""
    pattern, ns, ranking, qpos, dtype = job.pattern, job.ns, job.ranking, job.qpos, job.dtype
    gram_cache = {} if gram_cache is None else gram_cache
    batch, heads, _, _ = pattern.shape
    n_sel = qpos.shape[1]
    group = job.group
    k_hi = int(qpos.max()) + 1  # causal: no chosen query sees a later key
    rows = (pattern if job.all_rows else gather_rows(pattern, qpos)).detach()
    rows = (rows if rows.dtype in (torch.float32, torch.float64) else rows.to(dtype)).contiguous()
    values = job.v.detach()[:, :k_hi].to(dtype).permute(0, 2, 1, 3).contiguous()  # [batch, kv, key, d]
    squares = engine.squared_norms(values.numpy())
    if isinstance(ranking, torch.Tensor):
        mode = 2
        scores = ranking.detach().contiguous()  # the job's scores, converted once (selection.prepare_scores)
    else:
        mode, scores = (0 if ranking == "attention" else 1), rows
    # the contribution ranking's ‖v‖ (selection.value_norms64: one square root)
    norms64 = engine.norms_from_squares(squares) if mode == 1 else squares
    # A Gram matrix V Vᵀ per kv head pays off when many query rows read it (``queries="all"``).
    use_gram = group * n_sel * len(ns) >= k_hi
    rule = engine.Rule(np.asarray(ns, dtype=np.int64), mode, job.exclude_sink, job.distance == "euclidean", use_gram,
                       group, job.window or 0)
    metrics = engine.Metrics(*(torch.full((batch, heads, n_sel, len(ns)), torch.nan, dtype=dtype) for _ in range(5)),
                             torch.zeros(batch, heads, n_sel, len(ns), dtype=torch.bool))
    checks = engine.RowChecks(*torch.zeros(3, batch, heads, n_sel, dtype=torch.float64))
    key_mask, qpos_c = job.key_mask.contiguous(), qpos.contiguous()
    whole = gram_cache.get((k_hi, dtype))
    for b_sl, kv_sl, block, gram in block_grams(values, use_gram, whole=whole):
        h_sl = slice(kv_sl.start * group, kv_sl.stop * group)
        if gram is None:
            gram = block.new_empty(0, 0, 0, 0)
        elif block.shape[:2] == values.shape[:2]:  # one block: kept for the next call on these values
            gram_cache[(k_hi, dtype)] = gram

        def cut(x, heads_axis=True, b_sl=b_sl, h_sl=h_sl):
            return x[b_sl, h_sl].numpy() if heads_axis else x[b_sl].numpy()

        engine.separability_rows(
            engine.SeparabilityRows(cut(rows), cut(scores), cut(qpos_c, False), cut(job.query_valid, False),
                                    cut(key_mask, False)),
            engine.Values(block.numpy(), squares[b_sl, kv_sl], norms64[b_sl, kv_sl], gram.contiguous().numpy()),
            rule, engine.Metrics(*(cut(x) for x in metrics)), engine.RowChecks(*(cut(x) for x in checks)))
    check_distribution(checks.total, checks.negatives > 0, checks.visible, job.query_valid, pattern.dtype)
    return MetricFields(**metrics._asdict())

