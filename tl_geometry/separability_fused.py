"""The fused separability backend (CPU): the numba kernel of ``separability_kernel`` over blocks.

Values are prepared once per call (kv-head layout, float64 squared norms, and when many query
rows read them one Gram matrix ``V Vᵀ`` per kv head, in blocks that bound the extra memory).
Takes a :class:`~tl_geometry.query_rows.SeparabilityJob` and returns
:class:`~tl_geometry.query_rows.MetricFields`, as the torch backend does.
"""

from __future__ import annotations

import numpy as np
import torch

from .query_rows import MetricFields, SeparabilityJob, check_distribution, gather_rows, gram_blocks
from .separability_kernel import norms_from_squares, numba_threads, separability_rows, squared_norms

__all__ = ["separability_fused"]

_METRIC_FIELDS = ("precision", "recall", "f", "margin", "inversions")
# Row elements (rows × keys) below which the kernel runs on one thread.
_PARALLEL_ELEMENTS = 1 << 17


def separability_fused(job: SeparabilityJob, *, gram_cache: dict | None = None) -> MetricFields:
    """The metrics of ``job`` (CPU tensors); calls on the same values may share ``gram_cache``."""
    pattern, v, ns, ranking, qpos, dtype = job.pattern, job.v, job.ns, job.ranking, job.qpos, job.dtype
    gram_cache = {} if gram_cache is None else gram_cache
    batch, heads, _, _ = pattern.shape
    n_sel = qpos.shape[1]
    group = job.group
    k_hi = int(qpos.max()) + 1  # causal: no chosen query sees a later key
    rows = (pattern if job.all_rows else gather_rows(pattern, qpos)).detach()
    rows = (rows if rows.dtype in (torch.float32, torch.float64) else rows.to(dtype)).contiguous()
    values = v.detach()[:, :k_hi].to(dtype).permute(0, 2, 1, 3).contiguous()  # [batch, kv, key, d]
    value_sq = squared_norms(values.numpy())
    if isinstance(ranking, torch.Tensor):
        scores = ranking.detach().to(torch.float64 if ranking.dtype == torch.float64 else torch.float32)
        mode, scores = 2, scores.contiguous()
    else:
        mode, scores = (0 if ranking == "attention" else 1), rows[:1, :1, :1, :1]
    # ‖v‖² and, for the contribution ranking only, ‖v‖ (selection.value_norms64: one square root)
    norms = (value_sq, norms_from_squares(value_sq) if mode == 1 else value_sq)
    # A Gram matrix V Vᵀ per kv head pays off when many query rows read it (``queries="all"``).
    use_gram = group * n_sel * len(ns) >= k_hi
    out = {name: torch.full((batch, heads, n_sel, len(ns)), torch.nan, dtype=dtype) for name in _METRIC_FIELDS}
    sink = torch.zeros(batch, heads, n_sel, len(ns), dtype=torch.bool)
    stats = torch.zeros(3, batch, heads, n_sel, dtype=torch.float64)
    q_valid = job.query_valid
    # Small jobs (e.g. the last query only) run on one thread: waking the pool costs more, and its
    # spinning workers would slow torch's next operations.
    threads = 1 if batch * heads * n_sel * k_hi < _PARALLEL_ELEMENTS else torch.get_num_threads()
    ns_array = np.asarray(ns, dtype=np.int64)
    with numba_threads(threads):
        _fused_blocks(rows, scores, mode, qpos, q_valid, job.key_mask, values, norms, ns_array, job.exclude_sink,
                      job.distance, group, use_gram, gram_cache, dtype, out, sink, stats)
    check_distribution(stats[0], stats[1] > 0, stats[2], q_valid, pattern.dtype)
    return MetricFields(**out, sink_selected=sink)


def _fused_blocks(rows, scores, mode, qpos, q_valid, key_mask, values, norms, ns_array, exclude_sink, distance,
                  group, use_gram, gram_cache, dtype, out, sink, stats):
    """The kernel over (batch, kv head) blocks whose Gram matrices fit ``query_rows.GRAM_BYTES``."""
    batch, kv, k_hi = values.shape[0], values.shape[1], values.shape[2]
    for b_sl, kv_sl in gram_blocks(batch, kv, k_hi * k_hi * values.element_size() if use_gram else 0):
        h_sl = slice(kv_sl.start * group, kv_sl.stop * group)
        if not use_gram:
            gram = values[:1, :1, :1, :1]
        elif (b_sl.stop - b_sl.start, kv_sl.stop - kv_sl.start) == (batch, kv):  # one block: keep for the next call
            gram = gram_cache.get((k_hi, dtype))
            if gram is None:
                gram = gram_cache[(k_hi, dtype)] = (values @ values.transpose(-1, -2)).contiguous()
        else:
            block = values[b_sl, kv_sl]
            gram = (block @ block.transpose(-1, -2)).contiguous()
        separability_rows(
            rows[b_sl, h_sl].numpy(), scores[b_sl, h_sl].numpy() if mode == 2 else scores.numpy(), mode,
            qpos[b_sl].contiguous().numpy(), q_valid[b_sl].numpy(), key_mask[b_sl].contiguous().numpy(),
            values[b_sl, kv_sl].numpy(), *(x[b_sl, kv_sl] for x in norms), gram.numpy(), use_gram, ns_array,
            exclude_sink, distance == "euclidean", group,
            *(out[name][b_sl, h_sl].numpy() for name in _METRIC_FIELDS), sink[b_sl, h_sl].numpy(),
            *(stat[b_sl, h_sl].numpy() for stat in stats),
        )

