"""The contract between :func:`~tl_geometry.separability` and its backends: one
:class:`SeparabilityJob` prepared once (rows gathered, checked, in the working dtype), the
:class:`MetricFields` every backend returns, and the blocks of Gram matrices ``V Vᵀ`` a bounded
memory allows."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypedDict

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ..config import Distance, Ranking
from ..errors import TLGeometryError
from .query_rows import (
    check_inputs,
    default_masks,
    finite_values,
    gather_rows,
    query_positions,
    working_dtype,
)
from .selection import check_window, prepare_scores

__all__ = ["SeparabilityJob", "MetricFields", "prepare_separability", "GRAM_BYTES", "gram_blocks", "block_grams"]

# Bytes of one block of Gram matrices V Vᵀ (numba backend, layer pass, regime fit); bounds their memory.
GRAM_BYTES = 1 << 26


class MetricFields(TypedDict):
    """What a separability backend returns: ``[batch, head, q, len(ns)]`` tensors (NaN / False
    where undefined), in the job's working dtype."""

    precision: Tensor
    recall: Tensor
    f: Tensor
    margin: Tensor
    inversions: Tensor
    sink_selected: Tensor


@dataclass(frozen=True)
class SeparabilityJob:
    """Validated inputs of one separability call: the contract every backend implements.

    Attributes:
        pattern: ``[batch, head, query, key]`` as given (rows are checked by the backend's pass).
        v: ``[batch, key, kv_head, d_head]``, finite at real keys.
        ns: the distinct N values in increasing order (top-N sets are nested).
        ranking: a mode, or a score tensor of the chosen rows (``[batch, head, q, key]``), or of
            every row when ``all_rows``, as ``selection.prepare_scores`` converts it.
        qpos: ``[batch, q]`` chosen query positions; ``all_rows``: they are every position.
        key_mask, query_mask: ``[batch, pos]`` booleans.
        dtype: the working dtype (float32 or wider).
        window: the layer's sliding window (None: whole causal prefixes; ``selection.visible_sources``).
    """

    pattern: Float[Tensor, "batch head query key"]
    v: Float[Tensor, "batch key kv_head d_head"]
    ns: tuple[int, ...]
    distance: Distance
    ranking: Ranking | Tensor
    qpos: Int[Tensor, "batch q"]
    all_rows: bool
    exclude_sink: bool
    key_mask: Bool[Tensor, "batch key"]
    query_mask: Bool[Tensor, "batch query"]
    dtype: torch.dtype
    window: int | None = None

    @property
    def group(self) -> int:
        """Query heads per kv head."""
        return self.pattern.shape[1] // self.v.shape[2]

    @property
    def query_valid(self) -> Bool[Tensor, "batch q"]:
        """Which chosen queries are real."""
        return self.query_mask.gather(1, self.qpos)


def prepare_separability(pattern, v, ns: tuple[int, ...], *, distance, ranking, queries, exclude_sink,
                         key_mask, query_mask, window=None) -> SeparabilityJob:
    """Check the arguments of :func:`tl_geometry.separability` and build its job; the job holds
    the distinct ``ns`` in increasing order, and the caller puts the columns back in its order."""
    check_inputs(pattern, v)
    window = check_window(window)
    if distance not in ("euclidean", "cosine"):
        raise TLGeometryError(f"distance must be 'euclidean' or 'cosine'; got {distance!r}.")
    batch, heads, n_q, n_k = pattern.shape
    dtype = working_dtype(pattern, v)
    key_mask, query_mask = default_masks(pattern, key_mask, query_mask)
    v = finite_values(v, key_mask, dtype)
    qpos = query_positions(query_mask, queries)
    n_sel = qpos.shape[1]
    all_rows = isinstance(queries, str) and queries == "all"
    if isinstance(ranking, Tensor):
        # Full rows, or only the rows of the chosen queries (cheaper for a random ranking).
        if ranking.shape not in (pattern.shape, (batch, heads, n_sel, n_k)):
            raise TLGeometryError(
                f"a ranking score tensor must be shaped like pattern {tuple(pattern.shape)} or like the chosen "
                f"query rows {(batch, heads, n_sel, n_k)}; got {tuple(ranking.shape)}."
            )
        if not all_rows and not ranking.shape[2] == n_sel != n_q:  # full rows: keep the chosen ones
            ranking = gather_rows(ranking, qpos)
        ranking = prepare_scores(ranking, dtype)  # the one conversion every route ranks by
    elif ranking not in ("attention", "contribution"):
        raise TLGeometryError(f"ranking must be 'attention', 'contribution' or a score tensor; got {ranking!r}.")
    return SeparabilityJob(pattern, v, tuple(sorted(set(ns))), distance, ranking, qpos, all_rows, exclude_sink,
                           key_mask, query_mask, dtype, window)


def gram_blocks(batch: int, kv: int, gram_bytes: int, budget: int | None = None) -> list[tuple[slice, slice]]:
    """(batch, kv head) blocks whose Gram matrices (``gram_bytes`` per kv head) fit ``budget``
    bytes (default ``GRAM_BYTES``, read at the call); one (sequence, kv head) at least: never more
    than one head's attention pattern."""
    budget = GRAM_BYTES if budget is None else budget
    per_sequence = kv * gram_bytes
    if per_sequence * batch <= budget:
        return [(slice(0, batch), slice(0, kv))]
    if per_sequence <= budget:
        step = budget // per_sequence
        return [(slice(lo, min(lo + step, batch)), slice(0, kv)) for lo in range(0, batch, step)]
    return [(slice(b, b + 1), slice(h, h + 1)) for b in range(batch) for h in range(kv)]


def block_grams(values: Float[Tensor, "batch kv key d"], use_gram: bool = True, budget: int | None = None, *,
                whole: Tensor | None = None, buffer: Callable[[tuple[int, ...]], Tensor] | None = None
                ) -> Iterator[tuple[slice, slice, Tensor, Tensor | None]]:
    """``(sequences, kv heads, values block, its Gram matrices V Vᵀ)`` over the blocks of
    :func:`gram_blocks` (the Gram matrices None without ``use_gram``). ``whole``: the caller's
    Gram matrices of all the values, one block whatever the budget; ``buffer(shape)``: where to
    write a block's (a reused workspace), else a new tensor."""
    batch, n_kv, n_k, _ = values.shape
    if use_gram and whole is not None:
        yield slice(0, batch), slice(0, n_kv), values, whole
        return
    for b_sl, kv_sl in gram_blocks(batch, n_kv, n_k * n_k * values.element_size() if use_gram else 0, budget):
        block = values[b_sl, kv_sl]
        gram = None
        if use_gram:
            out = None if buffer is None else buffer((*block.shape[:2], n_k, n_k))
            gram = torch.matmul(block, block.transpose(-1, -2), out=out)
        yield b_sl, kv_sl, block, gram
