"""Sink diagnostics (docs/metrics.md#sink): how position 0 differs from the other sources, per layer and head.

Position 0 is the sink (the BOS token when the tokenizer prepends one). For value vectors
``v_j`` of one kv head and attention rows ``α[t, ·]`` of one query head::

    norm_ratio  = mean_{j>0} ‖v_j‖ / ‖v_0‖        (the paper: the sink's value norm is 3-10× smaller)
    sink_cosine = mean_{j>0} cos(v_0, v_j)        (the paper: systematically negative)
    sink_mass[t] = α[t, 0];  sink_rank[t] = rank of the sink under the ranking (0 = first)
    align_sink[t, N] = cos(s_N, v_0);  align_current[t, N] = cos(s_N, v_t)

A row whose sliding window has left position 0 behind has no sink: its ``sink_mass``,
``sink_rank`` and ``align_sink`` are NaN, and :func:`f_by_sink` counts it on neither side.

``F_N`` with the sink removed from the candidates is ``separability(..., exclude_sink=True)``;
``F_N`` split by whether the sink is in the top-N set is :func:`f_by_sink`.

Example:
    >>> import torch
    >>> v = torch.tensor([[1.0, 0], [-2, 0], [0, 2]])[None, :, None, :]   # [batch, key, kv, d]
    >>> pattern = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0.2, 0.3, 0.5]])[None, None]
    >>> g = sink_geometry(pattern, v, n=1)
    >>> g.norm_ratio.tolist(), g.sink_cosine.tolist()
    ([[2.0]], [[-0.5]])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ..config import Queries, Ranking
from .metrics import Separability
from .query_rows import QueryRows, as_n_tuple, query_rows
from .selection import COS_EPS, first_visible, top_order

__all__ = ["sink_geometry_of", "SinkGeometry", "sink_geometry", "f_by_sink", "value_norms_and_sink_cosines", "value_sink_statistics"]


@dataclass
class SinkGeometry:
    """Sink diagnostics of one layer.

    Attributes:
        n: N values of the alignment fields (last axis).
        sink_norm, mean_norm: ``[batch, kv_head]`` ‖v_0‖ and the mean ‖v_j‖ over real j > 0.
        norm_ratio: ``[batch, kv_head]`` mean_norm / sink_norm.
        sink_cosine: ``[batch, kv_head]`` mean over real j > 0 of cos(v_0, v_j).
        cosine_by_lag: ``[batch, kv_head, key]`` cos(v_0, v_j) at position j (NaN at 0 and pads).
        sink_mass: ``[batch, head, q]`` α[t, 0] (NaN for pad queries and rows without a visible sink).
        sink_rank: ``[batch, head, q]`` sources ranked before the sink (ties to the lower
            position, so the sink wins ties); float, NaN for pad queries and rows without a visible sink.
        align_sink, align_current: ``[batch, head, q, n]`` cos(s_N, v_0) and cos(s_N, v_t), NaN
            where N ≥ t + 1 (docs/metrics.md#selection range).
        query_positions: ``[batch, q]``.
    """

    n: tuple[int, ...]
    sink_norm: Float[Tensor, "batch kv_head"]
    mean_norm: Float[Tensor, "batch kv_head"]
    norm_ratio: Float[Tensor, "batch kv_head"]
    sink_cosine: Float[Tensor, "batch kv_head"]
    cosine_by_lag: Float[Tensor, "batch kv_head key"]
    sink_mass: Float[Tensor, "batch head q"]
    sink_rank: Float[Tensor, "batch head q"]
    align_sink: Float[Tensor, "batch head q n"]
    align_current: Float[Tensor, "batch head q n"]
    query_positions: Int[Tensor, "batch q"]


def _cosine(x: Tensor, y: Tensor) -> Tensor:
    """cos along the last axis with the 1e-12 guard of the cosine distance (docs/metrics.md#separability)."""
    return (x * y).sum(-1) / (x.norm(dim=-1) * y.norm(dim=-1) + COS_EPS)


def value_norms_and_sink_cosines(
    values: Float[Tensor, "batch kv key d"], key_mask: Bool[Tensor, "batch key"]
) -> tuple[Float[Tensor, "batch kv key"], Float[Tensor, "batch kv key"], Bool[Tensor, "batch key"]]:
    """``‖v_j‖``, ``cos(v_0, v_j)`` and the mask of real non-sink keys (j > 0, not a pad)."""
    norms = values.norm(dim=-1)
    cosines = _cosine(values, values[:, :, :1])
    nonsink = key_mask.clone()
    nonsink[:, 0] = False
    return norms, cosines, nonsink


def value_sink_statistics(
    norms: Float[Tensor, "batch kv key"], cosines: Float[Tensor, "batch kv key"], nonsink: Bool[Tensor, "batch key"]
) -> dict[str, Tensor]:
    """The per-kv-head fields of :class:`SinkGeometry` from the norms and sink cosines of the values."""
    nan = torch.tensor(torch.nan, dtype=norms.dtype, device=norms.device)
    nonsink_kv = nonsink[:, None, :]
    mean_norm = torch.where(nonsink_kv, norms, nan).nanmean(-1)
    sink_norm = norms[..., 0]
    cosine_by_lag = torch.where(nonsink_kv, cosines, nan)
    return {"sink_norm": sink_norm, "mean_norm": mean_norm, "norm_ratio": mean_norm / sink_norm,
            "sink_cosine": cosine_by_lag.nanmean(-1), "cosine_by_lag": cosine_by_lag}


def sink_geometry(
    pattern: Float[Tensor, "batch head query key"],
    v: Float[Tensor, "batch key kv_head d_head"],
    n: int | Sequence[int] = (1, 2, 4, 8, 16, 32),
    *,
    ranking: Ranking | Tensor = "attention",
    queries: Queries | Tensor = "all",
    exclude_sink: bool = False,
    key_mask: Bool[Tensor, "batch key"] | None = None,
    query_mask: Bool[Tensor, "batch query"] | None = None,
    window: int | None = None,
) -> SinkGeometry:
    """Sink diagnostics of one layer (docs/metrics.md#sink). Shapes and definitions: :class:`SinkGeometry`.

    Args:
        pattern: ``[batch, head, query, key]`` post-softmax weights; v: ``[batch, key, kv_head, d_head]``.
        n: N values for the alignments of the top-N aggregate ``s_N``.
        ranking: ``"attention"``, ``"contribution"`` or scores shaped like the chosen rows.
        queries, key_mask, query_mask, window: as in :func:`tl_geometry.separability`.
        exclude_sink: the alignments' ``s_N`` aggregates the top-N of sources ``1..t`` (as
            ``separability(..., exclude_sink=True)`` selects); the sink's mass and rank are unchanged.
    """
    rows = query_rows(pattern, v, queries=queries, key_mask=key_mask, query_mask=query_mask, window=window)
    return sink_geometry_of(rows, as_n_tuple(n), ranking, exclude_sink)


def sink_geometry_of(rows: QueryRows, ns: tuple[int, ...], ranking: Ranking | Tensor = "attention",
                     exclude_sink: bool = False) -> SinkGeometry:
    """:func:`sink_geometry` of rows already gathered (:func:`~.query_rows.query_rows`): the layer
    pass's torch branch gathers them once for every measure."""
    batch, heads, n_sel, n_k = rows.alpha.shape
    nan = torch.tensor(torch.nan, dtype=rows.alpha.dtype, device=rows.alpha.device)
    key_mask = rows.key_mask

    norm_stats = value_sink_statistics(*value_norms_and_sink_cosines(rows.values, key_mask))

    valid = rows.valid[:, None, :]  # [batch, 1, q]
    has_sink = rows.visible[:, None, :, 0]  # real rows that see position 0
    score = rows.selection_scores(ranking)
    sink_mass = torch.where(has_sink, rows.alpha[..., 0], nan)
    ahead = ((score > score[..., :1]) & rows.visible[:, None]).sum(-1, dtype=torch.int32)
    sink_rank = torch.where(has_sink, ahead.to(rows.alpha.dtype), nan)

    n_candidates = rows.candidates(exclude_sink).sum(-1)[:, None, :]  # [batch, 1, q]
    distinct = tuple(sorted(set(ns)))  # nested sets grow over increasing N
    order = top_order(rows.selection_scores(ranking, exclude_sink), min(distinct[-1], n_k))
    weights = torch.zeros_like(rows.alpha)
    v_heads = rows.per_head(rows.values)  # [batch, head, key, d]
    v_current = v_heads.gather(2, rows.qpos[:, None, :, None].expand(batch, heads, n_sel, v_heads.shape[-1]))
    align_sink, align_current = {}, {}
    for n_value in distinct:
        top = order[..., :n_value]
        weights.scatter_(-1, top, rows.alpha.gather(-1, top))
        agg = weights @ v_heads  # s_N [batch, head, q, d]
        defined = valid & (n_candidates > n_value)
        align_sink[n_value] = torch.where(defined & has_sink, _cosine(agg, v_heads[:, :, :1]), nan)
        align_current[n_value] = torch.where(defined, _cosine(agg, v_current), nan)
    return SinkGeometry(
        n=ns, **norm_stats, sink_mass=sink_mass, sink_rank=sink_rank,
        align_sink=torch.stack([align_sink[x] for x in ns], -1),
        align_current=torch.stack([align_current[x] for x in ns], -1),
        query_positions=rows.qpos,
    )


def f_by_sink(sep: Separability, window: int | None = None
              ) -> tuple[Float[Tensor, "batch head q n"], Float[Tensor, "batch head q n"]]:
    """``F_N`` where the sink is in the top-N set, and where it is a candidate left out (NaN
    elsewhere: undefined rows, and rows whose sliding ``window`` has left the sink behind).

    >>> f_sel, f_unsel = f_by_sink(sep)        # doctest: +SKIP
    >>> f_sel.nanmean(), f_unsel.nanmean()      # the paper: a selected sink lowers F_N  # doctest: +SKIP
    """
    nan = torch.tensor(torch.nan, dtype=sep.f.dtype, device=sep.f.device)
    has_sink = (first_visible(sep.query_positions, window) == 0)[:, None, :, None].to(sep.f.device)
    return (torch.where(sep.sink_selected, sep.f, nan),
            torch.where(~sep.sink_selected & sep.defined & has_sink, sep.f, nan))
