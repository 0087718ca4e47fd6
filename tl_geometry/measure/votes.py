"""Winner-source votes (docs/metrics.md#taxonomy), the evidence of the head taxonomy.

Each query ``t`` votes for its winner source ``w(t) = argmax_j α[t, j]·‖v_j‖`` (ties to the lower
position): ``current`` if ``w(t) = t``, ``sink`` if ``w(t) = 0``, ``other`` otherwise. Query 0
(where current = sink) and pad queries cast no vote. The offset ``t − w(t)`` of ``other`` votes
tells a previous-token head (offset 1) from a diffuse one.

Example:
    >>> import torch
    >>> pattern = torch.eye(4)[None, None]            # every query attends to itself
    >>> v = torch.ones(1, 4, 1, 2)
    >>> winner_sources(pattern, v).tolist()           # query 0 casts no vote
    [[[-1, 1, 2, 3]]]
    >>> vote_counts(pattern, v).tolist()              # [batch, head, (current, sink, other)]
    [[[3, 0, 0]]]
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ..config import Queries
from .query_rows import QueryRows, query_rows

__all__ = ["VOTES", "winner_sources", "winners_of", "vote_counts", "votes_from_winners", "offset_counts"]

VOTES = ("current", "sink", "other")


def _winners(pattern, v, queries, key_mask, query_mask, window) -> tuple[Tensor, Tensor]:
    return winners_of(query_rows(pattern, v, queries=queries, key_mask=key_mask, query_mask=query_mask, window=window))


def winners_of(rows: QueryRows) -> tuple[Int[Tensor, "batch head q"], Int[Tensor, "batch q"]]:
    """:func:`winner_sources` of rows already gathered, with their query positions."""
    score = rows.alpha * rows.per_head(rows.value_norm)[:, :, None, :]
    score = torch.where(rows.visible[:, None], score, -torch.inf)
    winner = score.argmax(-1)  # the first maximum: ties go to the lower position
    votes = rows.valid & (rows.qpos > 0)
    return torch.where(votes[:, None], winner, -1), rows.qpos


def winner_sources(
    pattern: Float[Tensor, "batch head query key"],
    v: Float[Tensor, "batch key kv_head d_head"],
    *,
    queries: Queries | Tensor = "all",
    key_mask: Bool[Tensor, "batch key"] | None = None,
    query_mask: Bool[Tensor, "batch query"] | None = None,
    window: int | None = None,
) -> Int[Tensor, "batch head q"]:
    """Winner source of every chosen query: ``argmax_j α[t, j]·‖v_j‖`` over the visible real keys
    (within the layer's sliding ``window``, where it has one: a row that no longer sees position 0
    votes ``current`` or ``other``), ties to the lower position; ``-1`` for queries that cast no
    vote (pads and position 0)."""
    return _winners(pattern, v, queries, key_mask, query_mask, window)[0]


def votes_from_winners(winners: Int[Tensor, "batch head q"], qpos: Int[Tensor, "batch q"]) -> Int[Tensor, "batch head 3"]:
    """Counts of (current, sink, other) votes; ``-1`` winners cast none."""
    t = qpos[:, None, :].expand_as(winners)
    kinds = torch.stack([winners == t, winners == 0, (winners > 0) & (winners != t)], -1)
    return kinds.sum(2)


def vote_counts(
    pattern: Float[Tensor, "batch head query key"],
    v: Float[Tensor, "batch key kv_head d_head"],
    *,
    queries: Queries | Tensor = "all",
    key_mask: Bool[Tensor, "batch key"] | None = None,
    query_mask: Bool[Tensor, "batch query"] | None = None,
    window: int | None = None,
) -> Int[Tensor, "batch head 3"]:
    """Votes per sequence and head, ``[..., (current, sink, other)]``."""
    return votes_from_winners(*_winners(pattern, v, queries, key_mask, query_mask, window))


def offset_counts(winners: Int[Tensor, "batch head q"], qpos: Int[Tensor, "batch q"], n_pos: int
                  ) -> Int[Tensor, "batch head offset"]:
    """Histogram of ``t − w(t)`` over ``other`` votes, ``[..., offset 0..n_pos-1]`` (offset 0 stays empty)."""
    t = qpos[:, None, :].expand_as(winners)
    other = (winners > 0) & (winners != t)
    offsets = torch.where(other, t - winners, 0)
    counts = torch.zeros(*winners.shape[:2], n_pos, dtype=torch.long, device=winners.device)
    return counts.scatter_add_(-1, offsets, other.long())
