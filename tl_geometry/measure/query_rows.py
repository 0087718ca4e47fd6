"""Input checks and the preparation of query rows, done once and handed to every consumer.

:func:`prepare_separability` validates a ``(pattern, v)`` pair with its masks and options and
returns a :class:`SeparabilityJob`, the typed contract between :func:`tl_geometry.separability`
and its backends (``separability_numba``: the numba kernel on CPU; ``separability_torch``: any
device): each backend takes a job and returns :class:`MetricFields`. :func:`query_rows` gives
the masked rows that the sink and regime diagnostics read as whole rows.

The row checks accept a row sum off by at most :func:`row_sum_tolerance` of the pattern's own
dtype: a bfloat16 softmax is only good to a few parts in a thousand.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ..config import Queries, Ranking
from ..errors import TLGeometryError
from .selection import (
    check_window,
    prepare_scores,
    selection_scores,
    squared_value_norms,
    value_norms64,
    visible_sources,
)

__all__ = ["QueryRows", "query_rows", "query_positions", "row_sum_tolerance", "finite_values", "squared_norm_limit", "working_dtype"]

# Float32 and wider: a softmax row sums to 1 within far less; 1e-3 still catches raw scores.
_ROW_SUM_TOL = 1e-3
# Narrow dtypes: every entry carries a relative rounding error of up to eps/2, and the softmax
# that produced them a few more; 4 eps covers both (bfloat16: 0.031, float16: 0.0039).
_ROW_SUM_EPS = 4


def as_n_tuple(n: int | Sequence[int]) -> tuple[int, ...]:
    """N as a tuple of ints ≥ 1, in the caller's order (repeats kept)."""
    if isinstance(n, Tensor):
        n = n.tolist()
    values = tuple(n) if isinstance(n, Sequence) and not isinstance(n, str) else (n,)
    if not values:
        raise TLGeometryError("n is empty: pass an int or a non-empty sequence of ints ≥ 1.")
    out = []
    for value in values:
        if isinstance(value, Tensor) and value.numel() == 1 and not value.is_floating_point():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TLGeometryError(f"n must be integers ≥ 1; got {value!r} of type {type(value).__name__}.")
        if value < 1:
            raise TLGeometryError(f"n must be ≥ 1; got {value}. N counts the selected sources.")
        out.append(value)
    return tuple(out)


def check_inputs(pattern: Tensor, v: Tensor) -> None:
    """Shapes: ``pattern`` ``[batch, head, pos, pos]``, ``v`` ``[batch, pos, kv_head, d_head]``, kv heads dividing heads."""
    if not isinstance(pattern, Tensor) or pattern.ndim != 4:
        raise TLGeometryError(
            f"pattern must be a tensor [batch, head, query, key]; got shape "
            f"{tuple(getattr(pattern, 'shape', ()))}."
        )
    if not isinstance(v, Tensor) or v.ndim != 4:
        raise TLGeometryError(f"v must be a tensor [batch, key, kv_head, d_head]; got shape {tuple(getattr(v, 'shape', ()))}.")
    batch, heads, n_q, n_k = pattern.shape
    if n_q != n_k:
        raise TLGeometryError(f"pattern must be square over positions (query = key = sequence); got {n_q} x {n_k}.")
    if v.shape[0] != batch or v.shape[1] != n_k:
        raise TLGeometryError(
            f"v has shape {tuple(v.shape)} but pattern {tuple(pattern.shape)}: v must be "
            f"[batch={batch}, key={n_k}, kv_head, d_head]."
        )
    if heads % v.shape[2]:
        raise TLGeometryError(f"v has {v.shape[2]} kv heads, which does not divide pattern's {heads} heads.")


def working_dtype(pattern: Tensor, v: Tensor) -> torch.dtype:
    """The dtype geometry computes in: the wider of the inputs', float32 at least."""
    return torch.promote_types(torch.promote_types(pattern.dtype, v.dtype), torch.float32)


def squared_norm_limit(dtype: torch.dtype, d_head: int) -> float:
    """The largest ``‖v‖²`` that geometry in ``dtype`` accepts, ``finfo.max / (16·d_head)``: the
    measurement's sums and the certificates' forms (at most ten terms of size ``‖v‖²``) then stay
    finite (docs/theory.md, Lemma 3's model)."""
    return torch.finfo(dtype).max / (16 * d_head)


def check_values(v: Tensor, key_mask: Tensor, dtype: torch.dtype) -> Bool[Tensor, "batch key"]:
    """Value vectors of real keys must be finite (NaN or inf would give meaningless distances) and
    small enough for ``dtype`` geometry (:func:`squared_norm_limit`). Returns which keys', pads
    included, are."""
    squares = v.detach().double().square().sum(-1).amax(-1)  # [batch, key]: the largest over kv heads
    limit = squared_norm_limit(dtype, v.shape[-1])
    usable = squares <= limit  # False for NaN and inf
    real = key_mask.to(usable.device)
    if bool((~torch.isfinite(v).flatten(2).all(-1) & real).any()):
        raise TLGeometryError("v contains NaN or infinite values at real keys: check the model run (dtype overflow?) "
                              "or mask those positions as pads.")
    if bool((~usable & real).any()):
        largest = math.sqrt(float(squares.masked_fill(~real, 0).max()))
        fix = "pass a float64 pattern and values" if dtype != torch.float64 else "rescale the values"
        raise TLGeometryError(f"value vectors reach ‖v‖ = {largest:.3g} at real keys, more than {dtype} geometry "
                              f"holds without overflow (‖v‖ ≤ {math.sqrt(limit):.3g} at d_head = {v.shape[-1]}): {fix}.")
    return usable


def finite_values(v: Tensor, key_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """``v`` with the values of pad keys that :func:`check_values` would refuse (non-finite or too
    large for ``dtype``) set to 0, after it refused them at real keys: pads take no part, but a NaN
    there would reach sums as ``0·NaN``. The one rule of every consumer (both separability
    backends, the bounds, the sink diagnostics, the layer pass)."""
    usable = check_values(v, key_mask, dtype)
    return v if bool(usable.all()) else torch.where(usable[..., None, None], v, 0.0)


def row_sum_tolerance(dtype: torch.dtype) -> float:
    """How far a real row of a ``dtype`` pattern may sum from 1: ``max(1e-3, 4·eps)``."""
    return max(_ROW_SUM_TOL, _ROW_SUM_EPS * torch.finfo(dtype).eps) if dtype.is_floating_point else _ROW_SUM_TOL


def check_distribution(sums: Tensor, negative: Tensor, visible_mass: Tensor, valid: Tensor,
                       dtype: torch.dtype) -> None:
    """Rows of real queries must be causal probability distributions.

    Takes only row statistics ``[batch, head, q]`` (the sum, whether any entry is negative, the
    mass on visible keys) and the pattern's own ``dtype`` (it sets the tolerance): NaN/inf
    propagate into the sums, and mass outside the visible keys means a non-causal model.
    """
    valid = valid[:, None, :]
    tolerance = row_sum_tolerance(dtype)
    if bool((~torch.isfinite(sums) & valid).any()):
        raise TLGeometryError("pattern contains NaN or infinite values in real query rows; check the model run "
                              "(dtype overflow?).")
    if bool((negative & valid).any()):
        raise TLGeometryError("pattern has negative entries: pass post-softmax hook_pattern, not hook_attn_scores.")
    off = ((sums - 1).abs() > tolerance) & valid
    if bool(off.any()):
        worst = float((sums - 1).abs().masked_fill(~valid, 0).max())
        raise TLGeometryError(
            f"pattern rows do not sum to 1 (off by up to {worst:.3g}, more than {tolerance:.3g} for {dtype}): "
            "pass post-softmax hook_pattern of a causal model, and mark pad rows: attention_mask= to tlg.analyze "
            "(and to run_with_cache when the cache was padded), query_mask= to the tensor functions."
        )
    if bool((((sums - visible_mass) > tolerance) & valid).any()):
        raise TLGeometryError(
            "pattern puts weight on keys its queries cannot see (future or pad keys, or keys before a sliding "
            "window): the model is not causal, the attention mask does not match the run, or window= is "
            "shorter than the layer's window. Geometry needs each query's visible sources."
        )


def default_masks(pattern: Tensor, key_mask: Tensor | None, query_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Boolean ``[batch, pos]`` masks, all True when not given; shapes checked against ``pattern``."""
    batch, _, n_q, n_k = pattern.shape
    key_mask = torch.ones(batch, n_k, dtype=torch.bool, device=pattern.device) if key_mask is None else key_mask.bool()
    query_mask = torch.ones(batch, n_q, dtype=torch.bool, device=pattern.device) if query_mask is None else query_mask.bool()
    if key_mask.shape != (batch, n_k) or query_mask.shape != (batch, n_q):
        raise TLGeometryError(f"key_mask and query_mask must be [batch, pos] = {(batch, n_k)}.")
    return key_mask, query_mask


def query_positions(
    query_mask: Bool[Tensor, "batch query"], queries: Queries | Tensor
) -> Int[Tensor, "batch q"]:
    """Query positions selected by ``queries`` ``[batch, q]``.

    ``"all"``: every position; ``"last"``: the last real query of each sequence; a 1-D
    LongTensor: those positions for every sequence.

    >>> query_positions(torch.tensor([[True, True, False]]), "last").tolist()
    [[1]]
    """
    batch, n_q = query_mask.shape
    device = query_mask.device
    if isinstance(queries, str):
        if queries == "all":
            return torch.arange(n_q, device=device).expand(batch, n_q)
        if queries == "last":
            ar = torch.arange(n_q, device=device)
            last = torch.where(query_mask, ar, -1).amax(1)
            if bool((last < 0).any()):
                raise TLGeometryError("a sequence has no real query (all pads): drop empty sequences.")
            return last[:, None]
        raise TLGeometryError(f"queries must be 'all', 'last' or a 1-D LongTensor of positions; got {queries!r}.")
    positions = torch.as_tensor(queries, device=device)
    if positions.ndim != 1 or positions.is_floating_point() or positions.numel() == 0:
        raise TLGeometryError("queries as positions must be a non-empty 1-D integer tensor.")
    if bool(((positions < 0) | (positions >= n_q)).any()):
        raise TLGeometryError(f"query positions must lie in 0..{n_q - 1}; got {positions.tolist()}.")
    return positions.long().expand(batch, -1)


def gather_rows(x: Tensor, qpos: Tensor) -> Tensor:
    """x [batch, head, query, key] → rows at qpos [batch, q] → [batch, head, q, key]."""
    batch, heads, _, n_k = x.shape
    index = qpos[:, None, :, None].expand(batch, heads, qpos.shape[1], n_k)
    return x.gather(2, index)


def check_rows(rows: Tensor, visible_mass: Tensor, valid: Tensor, dtype: torch.dtype) -> None:
    """:func:`check_distribution` of whole ``[batch, head, q, key]`` rows of a ``dtype`` pattern."""
    check_distribution(rows.sum(-1), rows.amin(-1) < 0, visible_mass, valid, dtype)


@dataclass
class QueryRows:
    """The chosen query rows of one layer, masked and typed for geometry (shared by the sink and
    regime diagnostics, which need whole rows rather than separability's query chunks).

    Attributes:
        qpos: ``[batch, q]`` query positions; ``valid`` ``[batch, q]`` which are real queries.
        alpha: ``[batch, head, q, key]`` weights on visible keys (0 elsewhere).
        visible: ``[batch, q, key]`` the keys each real query sees (``selection.visible_sources``);
            ``visible[..., 0]``: the row has its sink.
        values: ``[batch, kv, key, d]``; ``value_norm`` ``[batch, kv, key]``; ``group`` = heads / kv.
        key_mask: ``[batch, key]`` real keys.
    """

    qpos: Int[Tensor, "batch q"]
    valid: Bool[Tensor, "batch q"]
    alpha: Float[Tensor, "batch head q key"]
    visible: Bool[Tensor, "batch q key"]
    values: Float[Tensor, "batch kv key d"]
    value_norm: Float[Tensor, "batch kv key"]
    group: int
    key_mask: Bool[Tensor, "batch key"]

    def per_head(self, x: Tensor) -> Tensor:
        """``[batch, kv, ...]`` → ``[batch, head, ...]`` (query head h reads kv head h // group)."""
        return x.repeat_interleave(self.group, 1)

    def candidates(self, exclude_sink: bool = False) -> Bool[Tensor, "batch q key"]:
        """Candidate sources of each row: the visible keys, less key 0 with ``exclude_sink``."""
        if not exclude_sink:
            return self.visible
        return self.visible & (torch.arange(self.visible.shape[-1], device=self.visible.device) != 0)

    def selection_scores(self, ranking: Ranking | Tensor, exclude_sink: bool = False) -> Float[Tensor, "batch head q key"]:
        """:func:`selection_scores` of the rows (a score tensor must be shaped like the rows, and is
        converted here, :func:`prepare_scores`, as the separability job converts its own)."""
        if isinstance(ranking, Tensor):
            if ranking.shape != self.alpha.shape:
                raise TLGeometryError(f"ranking scores must be shaped like the chosen rows {tuple(self.alpha.shape)}.")
            ranking = prepare_scores(ranking, self.alpha.dtype)
        norm64 = value_norms64(self.values, self.squares) if isinstance(ranking, str) and ranking == "contribution" else None
        return selection_scores(self.alpha, self.candidates(exclude_sink)[:, None], ranking, norm64, self.group)

    @cached_property
    def squares(self) -> Float[Tensor, "batch kv key"]:
        """``‖v‖²`` in float64 (:func:`~tl_geometry.measure.selection.squared_value_norms`), computed once for
        every consumer of these rows (contribution scores, certificates)."""
        return squared_value_norms(self.values)


def query_rows(
    pattern: Float[Tensor, "batch head query key"],
    v: Float[Tensor, "batch key kv_head d_head"],
    *,
    queries: Queries | Tensor = "all",
    key_mask: Bool[Tensor, "batch key"] | None = None,
    query_mask: Bool[Tensor, "batch query"] | None = None,
    window: int | None = None,
) -> QueryRows:
    """Validate inputs and gather the chosen query rows (see :class:`QueryRows`)."""
    check_inputs(pattern, v)
    window = check_window(window)
    batch, heads, n_q, n_k = pattern.shape
    dtype = working_dtype(pattern, v)
    key_mask, query_mask = default_masks(pattern, key_mask, query_mask)
    v = finite_values(v, key_mask, dtype)
    qpos = query_positions(query_mask, queries)
    rows = gather_rows(pattern, qpos).to(dtype)
    valid = query_mask.gather(1, qpos)
    visible = visible_sources(key_mask, qpos, window) & valid[:, :, None]
    alpha = torch.where(visible[:, None], rows, 0.0)
    check_rows(rows, alpha.sum(-1), valid, pattern.dtype)
    values = v.to(dtype).permute(0, 2, 1, 3).contiguous()
    return QueryRows(qpos, valid, alpha, visible, values, values.norm(dim=-1), heads // v.shape[2], key_mask)


