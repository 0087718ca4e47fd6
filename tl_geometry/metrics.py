"""Geometric precision, recall and F-score of top-N attention selection (SPEC §1-4).

Framework-free: every function here takes raw tensors. For one query ``t`` with visible
sources ``0..t`` and contributions ``y_i = α[t,i]·v_i``, the top-N set ``S`` under a ranking
has aggregate ``s_N = Σ_{i∈S} y_i`` and distances ``D_i = d(y_i, s_N)``; then::

    ρ_max = max_{i∈S} D_i      ρ_min = min_{j∉S} D_j
    P_N = N / (N + #{j∉S : D_j ≤ ρ_max})      R_N = #{i∈S : D_i < ρ_min} / N
    F_N = 2PR/(P+R) (0 when R = 0)            γ_N = ρ_min − ρ_max
    GInv_N = Σ_{i∈S} Σ_{j∉S} 1{D_j ≤ D_i}

Speed: distances need only ``‖y_i‖² = α_i²‖v_i‖²``, ``⟨y_i, s_N⟩ = α_i⟨v_i, s_N⟩`` and
``‖s_N‖²``, and top-N sets are nested. CPU tensors go to a fused numba kernel
(``separability_kernel``: one query row at a time, Gram-matrix updates per new source); other
devices to vectorised torch code (per N two skinny matmuls per query chunk, ``s_N = (α·1_S) V``
and ``V s_N``, one ``topk`` per row, inversions by ``searchsorted``). Nothing loops over heads
or queries in Python.

Example:
    >>> import torch
    >>> pattern = torch.tensor([[[[1.0, 0, 0], [0.5, 0.5, 0], [0.2, 0.3, 0.5]]]])
    >>> v = torch.eye(3)[None, :, None, :]          # [batch, key, kv_head, d_head]
    >>> sep = separability(pattern, v, n=1)
    >>> sep.f[0, 0, 1:, 0].tolist()                   # Euclidean, N=1: always 1
    [1.0, 1.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

__all__ = [
    "Separability",
    "RandomSeparability",
    "separability",
    "random_separability",
    "separability_over_rankings",
    "inversion_bounds",
    "query_positions",
    "top_order",
    "QueryRows",
    "query_rows",
]

_ROW_SUM_TOL = 1e-3
_COS_EPS = 1e-12
_COMPARE_BELOW_N = 4
# Elements of one [batch, head, query-chunk, key] working tensor; bounds peak memory.
_CHUNK_ELEMENTS = 1 << 19


@dataclass
class Separability:
    """Per-query separability of top-N sets. Float fields are ``[batch, head, query, len(n)]``.

    Undefined entries (N ≥ number of candidate sources, pad queries, query 0) are NaN.

    Attributes:
        n: the N values, in the order of the last axis.
        precision, recall, f: P_N, R_N, F_N in [0, 1].
        margin: γ_N = ρ_min − ρ_max (distance units of the chosen metric).
        inversions: GInv_N (a count, stored as float so that NaN can mark undefined).
        sink_selected: bool, key 0 is in the top-N set (False where undefined).
        query_positions: ``[batch, query]`` the query positions of the query axis.
    """

    n: tuple[int, ...]
    precision: Float[Tensor, "batch head query n"]
    recall: Float[Tensor, "batch head query n"]
    f: Float[Tensor, "batch head query n"]
    margin: Float[Tensor, "batch head query n"]
    inversions: Float[Tensor, "batch head query n"]
    sink_selected: Bool[Tensor, "batch head query n"]
    query_positions: Int[Tensor, "batch query"]

    @property
    def defined(self) -> Bool[Tensor, "batch head query n"]:
        """Where the metrics are defined (1 ≤ N < number of candidate sources)."""
        return ~torch.isnan(self.precision)


@dataclass
class RandomSeparability:
    """Random-ranking baseline (SPEC §3): ``per_repeat`` fields ``[repeat, batch, head, query, n]``.

    ``mean`` is a :class:`Separability` averaged over repeats (NaN-aware); its ``sink_selected``
    is True where the sink was selected in at least half of the repeats.
    """

    per_repeat: Separability
    mean: Separability


def _as_n_tuple(n: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(n, Tensor):
        n = n.tolist()
    values = tuple(n) if isinstance(n, Sequence) and not isinstance(n, str) else (n,)
    if not values:
        raise ValueError("n is empty: pass an int or a non-empty sequence of ints ≥ 1.")
    out = []
    for value in values:
        if isinstance(value, Tensor) and value.numel() == 1 and not value.is_floating_point():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"n must be integers ≥ 1; got {value!r} of type {type(value).__name__}.")
        if value < 1:
            raise ValueError(f"n must be ≥ 1; got {value}. N counts the selected sources.")
        out.append(value)
    return tuple(out)


def _check_inputs(pattern: Tensor, v: Tensor) -> None:
    if not isinstance(pattern, Tensor) or pattern.ndim != 4:
        raise ValueError(
            f"pattern must be a tensor [batch, head, query, key]; got shape "
            f"{tuple(getattr(pattern, 'shape', ()))}."
        )
    if not isinstance(v, Tensor) or v.ndim != 4:
        raise ValueError(f"v must be a tensor [batch, key, kv_head, d_head]; got shape {tuple(getattr(v, 'shape', ()))}.")
    batch, heads, n_q, n_k = pattern.shape
    if n_q != n_k:
        raise ValueError(f"pattern must be square over positions (query = key = sequence); got {n_q} x {n_k}.")
    if v.shape[0] != batch or v.shape[1] != n_k:
        raise ValueError(
            f"v has shape {tuple(v.shape)} but pattern {tuple(pattern.shape)}: v must be "
            f"[batch={batch}, key={n_k}, kv_head, d_head]."
        )
    if heads % v.shape[2]:
        raise ValueError(f"v has {v.shape[2]} kv heads, which does not divide pattern's {heads} heads.")


def check_values(v: Tensor, key_mask: Tensor) -> None:
    """Value vectors of real keys must be finite (NaN or inf would give meaningless distances)."""
    finite = torch.isfinite(v).flatten(2).all(-1)  # [batch, key]
    if bool((~finite & key_mask.to(finite.device)).any()):
        raise ValueError("v contains NaN or infinite values at real keys: check the model run (dtype overflow?) "
                         "or mask those positions as pads.")


def _check_distribution(sums: Tensor, negative: Tensor, visible_mass: Tensor, valid: Tensor) -> None:
    """Rows of real queries must be causal probability distributions.

    Takes only row statistics ``[batch, head, q]`` (the sum, whether any entry is negative, the
    mass on visible keys): NaN/inf propagate into the sums, and mass outside the visible keys
    means a non-causal model.
    """
    valid = valid[:, None, :]
    if bool((~torch.isfinite(sums) & valid).any()):
        raise ValueError("pattern contains NaN or infinite values in real query rows; check the model run (dtype overflow?).")
    if bool((negative & valid).any()):
        raise ValueError("pattern has negative entries: pass post-softmax hook_pattern, not hook_attn_scores.")
    off = ((sums - 1).abs() > _ROW_SUM_TOL) & valid
    if bool(off.any()):
        worst = float((sums - 1).abs().masked_fill(~valid, 0).max())
        raise ValueError(
            f"pattern rows do not sum to 1 (off by up to {worst:.3g}): pass post-softmax hook_pattern, "
            "and query_mask for pad rows."
        )
    if bool((((sums - visible_mass) > _ROW_SUM_TOL) & valid).any()):
        raise ValueError(
            "pattern puts weight on future (or pad) keys: the model is not causal, or the attention mask "
            "does not match the run. Geometry needs sources 0..t."
        )


def _default_masks(pattern: Tensor, key_mask: Tensor | None, query_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Boolean ``[batch, pos]`` masks, all True when not given; shapes checked against ``pattern``."""
    batch, _, n_q, n_k = pattern.shape
    key_mask = torch.ones(batch, n_k, dtype=torch.bool, device=pattern.device) if key_mask is None else key_mask.bool()
    query_mask = torch.ones(batch, n_q, dtype=torch.bool, device=pattern.device) if query_mask is None else query_mask.bool()
    if key_mask.shape != (batch, n_k) or query_mask.shape != (batch, n_q):
        raise ValueError(f"key_mask and query_mask must be [batch, pos] = {(batch, n_k)}.")
    return key_mask, query_mask


def query_positions(
    query_mask: Bool[Tensor, "batch query"], queries: str | Tensor
) -> Int[Tensor, "batch q"]:
    """Query positions selected by ``queries`` (SPEC §4), ``[batch, q]``.

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
                raise ValueError("a sequence has no real query (all pads): drop empty sequences.")
            return last[:, None]
        raise ValueError(f"queries must be 'all', 'last' or a 1-D LongTensor of positions; got {queries!r}.")
    positions = torch.as_tensor(queries, device=device)
    if positions.ndim != 1 or positions.is_floating_point() or positions.numel() == 0:
        raise ValueError("queries as positions must be a non-empty 1-D integer tensor.")
    if bool(((positions < 0) | (positions >= n_q)).any()):
        raise ValueError(f"query positions must lie in 0..{n_q - 1}; got {positions.tolist()}.")
    return positions.long().expand(batch, -1)


def _gather_rows(x: Tensor, qpos: Tensor) -> Tensor:
    """x [batch, head, query, key] → rows at qpos [batch, q] → [batch, head, q, key]."""
    batch, heads, _, n_k = x.shape
    index = qpos[:, None, :, None].expand(batch, heads, qpos.shape[1], n_k)
    return x.gather(2, index)


def separability(
    pattern: Float[Tensor, "batch head query key"],
    v: Float[Tensor, "batch key kv_head d_head"],
    n: int | Sequence[int],
    *,
    distance: str = "euclidean",
    ranking: str | Tensor = "attention",
    queries: str | Tensor = "all",
    exclude_sink: bool = False,
    key_mask: Bool[Tensor, "batch key"] | None = None,
    query_mask: Bool[Tensor, "batch query"] | None = None,
    chunk_elements: int = _CHUNK_ELEMENTS,
    backend: str = "auto",
) -> Separability:
    """Geometric precision / recall / F-score of the top-N sources of every chosen query.

    Args:
        pattern: ``[batch, head, query, key]`` post-softmax weights (query = key = sequence).
        v: ``[batch, key, kv_head, d_head]`` value vectors; ``kv_head`` divides ``head`` and query
            head ``h`` reads kv head ``h // (head // kv_head)``. Passing the kv heads themselves
            (not copies aligned to query heads) saves work.
        n: N or several N values (the last output axis).
        distance: ``"euclidean"`` (primary) or ``"cosine"`` (``1 − cos``, eps 1e-12).
        ranking: ``"attention"`` (α), ``"contribution"`` (α‖v‖), or a score tensor shaped like
            ``pattern`` or like the chosen query rows ``[batch, head, q, key]`` (higher = selected
            first; no NaN). Ties go to the lower position.
        queries: ``"all"``, ``"last"`` or a 1-D LongTensor of positions.
        exclude_sink: remove key 0 from the candidate sources.
        key_mask, query_mask: ``[batch, pos]`` True for real tokens (default: all real).
        chunk_elements: torch backend: bound on ``batch·head·query_chunk·key`` per working tensor.
        backend: ``"auto"`` (the fused numba kernel for CPU tensors, torch otherwise),
            ``"numba"`` or ``"torch"``. Both implement the same definitions; see docs/performance.md.

    Returns:
        :class:`Separability` with ``[batch, head, query, len(n)]`` fields, computed in float32
        or wider (float64 inputs stay float64).
    """
    return _separability(pattern, v, n, distance=distance, ranking=ranking, queries=queries,
                         exclude_sink=exclude_sink, key_mask=key_mask, query_mask=query_mask,
                         chunk_elements=chunk_elements, backend=backend)


def _separability(pattern, v, n, *, distance="euclidean", ranking="attention", queries="all", exclude_sink=False,
                  key_mask=None, query_mask=None, chunk_elements=_CHUNK_ELEMENTS, backend="auto", gram_cache=None):
    """:func:`separability`; ``gram_cache`` (a dict) lets calls on the same values share Gram matrices."""
    _check_inputs(pattern, v)
    ns = _as_n_tuple(n)
    if distance not in ("euclidean", "cosine"):
        raise ValueError(f"distance must be 'euclidean' or 'cosine'; got {distance!r}.")
    batch, heads, n_q, n_k = pattern.shape
    dtype = torch.promote_types(torch.promote_types(pattern.dtype, v.dtype), torch.float32)
    key_mask, query_mask = _default_masks(pattern, key_mask, query_mask)
    check_values(v, key_mask)
    qpos = query_positions(query_mask, queries)
    n_sel = qpos.shape[1]
    all_rows = isinstance(queries, str) and queries == "all"
    if isinstance(ranking, Tensor):
        # Full rows, or only the rows of the chosen queries (cheaper for a random ranking).
        if ranking.shape not in (pattern.shape, (batch, heads, n_sel, n_k)):
            raise ValueError(
                f"a ranking score tensor must be shaped like pattern {tuple(pattern.shape)} or like the chosen "
                f"query rows {(batch, heads, n_sel, n_k)}; got {tuple(ranking.shape)}."
            )
        if bool(torch.isnan(ranking).any()):
            raise ValueError("ranking scores contain NaN: give every source a comparable score.")
        if not all_rows and not ranking.shape[2] == n_sel != n_q:  # full rows: keep the chosen ones
            ranking = _gather_rows(ranking, qpos)
    elif ranking not in ("attention", "contribution"):
        raise ValueError(f"ranking must be 'attention', 'contribution' or a score tensor; got {ranking!r}.")
    # Top-N sets are nested: both backends grow them over the distinct N in increasing order.
    distinct = tuple(sorted(set(ns)))
    args = (pattern, v, distinct, distance, ranking, qpos, all_rows, exclude_sink, key_mask, query_mask, dtype)
    if _use_fused(backend, pattern.device):
        out = _separability_fused(*args, {} if gram_cache is None else gram_cache)
    else:
        out = _separability_torch(*args, chunk_elements)
    if distinct != ns:
        columns = torch.tensor([distinct.index(value) for value in ns], device=pattern.device)
        out = {name: value.index_select(-1, columns) for name, value in out.items()}
    return Separability(n=ns, query_positions=qpos, **out)


def _use_fused(backend: str, device: torch.device) -> bool:
    if backend not in ("auto", "numba", "torch"):
        raise ValueError(f"backend must be 'auto', 'numba' or 'torch'; got {backend!r}.")
    if backend == "torch" or (backend == "auto" and device.type != "cpu"):
        return False
    if device.type != "cpu":
        raise ValueError(f"backend='numba' runs on CPU tensors; these are on {device}. Use backend='auto'.")
    try:
        from . import separability_kernel  # noqa: F401
    except ImportError as err:
        if backend == "numba":
            raise ImportError(f"backend='numba' needs numba ({err}); pip install numba, or use backend='torch'.") from err
        return False
    return True


_METRIC_FIELDS = ("precision", "recall", "f", "margin", "inversions")
# Bytes of one block of Gram matrices in the fused backend; bounds its extra memory.
_GRAM_BYTES = 1 << 26
# Row elements (rows × keys) below which the fused kernel runs on one thread.
_PARALLEL_ELEMENTS = 1 << 17


def _gram_blocks(batch: int, kv: int, gram_bytes: int) -> list[tuple[slice, slice]]:
    """(batch, kv head) blocks whose Gram matrices (``gram_bytes`` per kv head) fit ``_GRAM_BYTES``;
    one (sequence, kv head) at least: never more than one head's attention pattern."""
    per_sequence = kv * gram_bytes
    if per_sequence * batch <= _GRAM_BYTES:
        return [(slice(0, batch), slice(0, kv))]
    if per_sequence <= _GRAM_BYTES:
        step = _GRAM_BYTES // per_sequence
        return [(slice(lo, min(lo + step, batch)), slice(0, kv)) for lo in range(0, batch, step)]
    return [(slice(b, b + 1), slice(h, h + 1)) for b in range(batch) for h in range(kv)]


def _separability_fused(pattern, v, ns, distance, ranking, qpos, all_rows, exclude_sink, key_mask, query_mask, dtype,
                        gram_cache):
    """CPU backend: one numba kernel per batch slice (see ``separability_kernel``)."""
    from .separability_kernel import numba_threads, squared_norms

    batch, heads, _, _ = pattern.shape
    n_sel = qpos.shape[1]
    group = heads // v.shape[2]
    k_hi = int(qpos.max()) + 1  # causal: no chosen query sees a later key
    rows = (pattern if all_rows else _gather_rows(pattern, qpos)).detach()
    rows = (rows if rows.dtype in (torch.float32, torch.float64) else rows.to(dtype)).contiguous()
    values = v.detach()[:, :k_hi].to(dtype).permute(0, 2, 1, 3).contiguous()  # [batch, kv, key, d]
    value_sq = squared_norms(values.numpy())
    if isinstance(ranking, Tensor):
        scores = ranking.detach().to(torch.float64 if ranking.dtype == torch.float64 else torch.float32)
        mode, scores = 2, scores.contiguous()
    else:
        mode, scores = (0 if ranking == "attention" else 1), rows[:1, :1, :1, :1]
    # A Gram matrix V Vᵀ per kv head pays off when many query rows read it (``queries="all"``).
    use_gram = group * n_sel * len(ns) >= k_hi
    out = {name: torch.full((batch, heads, n_sel, len(ns)), torch.nan, dtype=dtype) for name in _METRIC_FIELDS}
    sink = torch.zeros(batch, heads, n_sel, len(ns), dtype=torch.bool)
    stats = torch.zeros(3, batch, heads, n_sel, dtype=torch.float64)
    q_valid = query_mask.gather(1, qpos)
    # Small jobs (e.g. the last query only) run on one thread: waking the pool costs more, and its
    # spinning workers would slow torch's next operations.
    threads = 1 if batch * heads * n_sel * k_hi < _PARALLEL_ELEMENTS else torch.get_num_threads()
    ns_array = np.asarray(ns, dtype=np.int64)
    with numba_threads(threads):
        _fused_blocks(rows, scores, mode, qpos, q_valid, key_mask, values, value_sq, ns_array, exclude_sink, distance,
                      group, use_gram, gram_cache, dtype, out, sink, stats)
    _check_distribution(stats[0], stats[1] > 0, stats[2], q_valid)
    return {**out, "sink_selected": sink}


def _fused_blocks(rows, scores, mode, qpos, q_valid, key_mask, values, value_sq, ns_array, exclude_sink, distance,
                  group, use_gram, gram_cache, dtype, out, sink, stats):
    """The kernel over (batch, kv head) blocks whose Gram matrices fit ``_GRAM_BYTES``."""
    from .separability_kernel import separability_rows

    batch, kv, k_hi = values.shape[0], values.shape[1], values.shape[2]
    for b_sl, kv_sl in _gram_blocks(batch, kv, k_hi * k_hi * values.element_size() if use_gram else 0):
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
            values[b_sl, kv_sl].numpy(), value_sq[b_sl, kv_sl], gram.numpy(), use_gram, ns_array,
            exclude_sink, distance == "euclidean", group,
            *(out[name][b_sl, h_sl].numpy() for name in _METRIC_FIELDS), sink[b_sl, h_sl].numpy(),
            *(stat[b_sl, h_sl].numpy() for stat in stats),
        )


def _separability_torch(pattern, v, ns, distance, ranking, qpos, all_rows, exclude_sink, key_mask, query_mask,
                        dtype, chunk_elements):
    """Vectorised torch backend (any device): query chunks of ``[batch, head, chunk, key]`` tensors."""
    batch, heads, n_q, n_k = pattern.shape
    device = pattern.device
    n_sel = qpos.shape[1]
    kv = v.shape[2]
    group = heads // kv
    values = v.to(dtype).permute(0, 2, 1, 3).contiguous()  # [batch, kv, key, d]
    value_sq = values.pow(2).sum(-1)  # [batch, kv, key]
    value_norm = value_sq.sqrt()
    value_sq64 = squared_value_norms(values) if isinstance(ranking, str) and ranking == "contribution" else None

    out = {name: torch.full((batch, heads, n_sel, len(ns)), torch.nan, dtype=dtype, device=device)
           for name in _METRIC_FIELDS}
    sink_selected = torch.zeros(batch, heads, n_sel, len(ns), dtype=torch.bool, device=device)

    chunk = max(1, chunk_elements // max(1, batch * heads * n_k))
    ar_full = torch.arange(n_k, device=device)
    for start in range(0, n_sel, chunk):
        q = qpos[:, start:start + chunk]  # [batch, c]
        sl = slice(start, start + q.shape[1])
        rows = (pattern[:, :, sl] if all_rows else _gather_rows(pattern, q)).to(dtype)
        q_valid = query_mask.gather(1, q)  # [batch, c]
        # Causal queries see keys 0..t only: work on the keys the chunk's latest query can see.
        k_hi = int(q.max()) + 1
        ar_k = ar_full[:k_hi]
        visible = (ar_k[None, None, :] <= q[:, :, None]) & key_mask[:, None, :k_hi] & q_valid[:, :, None]
        cand = visible & (ar_k != 0) if exclude_sink else visible
        cand = cand[:, None].expand(batch, heads, -1, k_hi)
        alpha = torch.where(visible[:, None], rows[..., :k_hi], 0.0)
        _check_rows(rows, alpha.sum(-1), q_valid)
        if exclude_sink:
            alpha[..., 0] = 0.0
        # rows of the chosen queries (a score tensor was gathered by the caller)
        chunk_ranking = ranking[:, :, sl, :k_hi] if isinstance(ranking, Tensor) else ranking
        score = selection_scores(alpha, cand, chunk_ranking, None if value_sq64 is None else value_sq64[..., :k_hi], group)
        order = top_order(score, min(max(ns), k_hi))
        n_cand = cand.sum(-1, dtype=torch.int32)  # [batch, head, c]; candidates hold ranks 0..n_cand-1

        metrics = _chunk_metrics(alpha, order, cand, n_cand, values[:, :, :k_hi], value_sq[..., :k_hi],
                                 value_norm[..., :k_hi], ns, group, distance)
        for name, value in metrics.items():
            (sink_selected if name == "sink_selected" else out[name])[:, :, sl] = value
    return {**out, "sink_selected": sink_selected}


def top_order(score: Float[Tensor, "... key"], m: int) -> Int[Tensor, "... m"]:
    """Indices of the ``m`` highest scores per row, best first, ties to the lower position.

    Equals ``torch.sort(score, descending=True, stable=True).indices[..., :m]``. For float32
    rows shorter than 2^16 it runs ``topk`` on unique int64 keys (order-preserving float bits,
    then the reversed position), about twice as fast as a stable full sort.

    >>> top_order(torch.tensor([0.2, 0.5, 0.2, 0.1]), 3).tolist()
    [1, 0, 2]
    """
    n_k = score.shape[-1]
    if score.dtype != torch.float32 or n_k >= 1 << 16:
        return torch.sort(score, dim=-1, descending=True, stable=True).indices[..., :m]
    bits = (score + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into 0.0 (they tie as floats)
    bits = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: reverse their bit order
    position = torch.arange(n_k - 1, -1, -1, device=score.device)  # earlier position, larger key
    keys = (bits.long() << 16) | position
    return keys.topk(m, dim=-1, sorted=True).indices


def squared_value_norms(values: Float[Tensor, "batch kv key d"]) -> Float[Tensor, "batch kv key"]:
    """``‖v‖²`` in float64: the one computation behind every contribution ranking (``α‖v‖``), so
    separability (either backend), the bounds and the sink diagnostics select the same sets."""
    if values.device.type == "cpu" and values.dtype in (torch.float32, torch.float64):
        try:
            from .separability_kernel import squared_norms
        except ImportError:
            pass
        else:
            return torch.from_numpy(squared_norms(values.detach().contiguous().numpy()))
    return values.detach().double().pow(2).sum(-1)


def selection_scores(
    alpha: Float[Tensor, "batch head q key"],
    candidates: Bool[Tensor, "... key"],
    ranking: str | Tensor,
    value_sq: Float[Tensor, "batch kv key"] | None,
    group: int,
) -> Float[Tensor, "batch head q key"]:
    """Scores that decide every top-N set (the fused kernel applies the same rule): ``α``,
    ``α·sqrt(‖v‖²)`` in float64 from :func:`squared_value_norms`, or the caller's scores;
    candidates' scores clamped to finite values and non-candidates at ``-inf``, so a candidate
    scored ``-inf`` still comes before every non-candidate. Ties are broken by :func:`top_order`."""
    if isinstance(ranking, Tensor):
        score = ranking.to(torch.promote_types(ranking.dtype, alpha.dtype))
    elif ranking == "contribution":
        score = alpha.double() * value_sq.sqrt().repeat_interleave(group, 1)[:, :, None, :]
    elif ranking == "attention":
        score = alpha
    else:
        raise ValueError(f"ranking must be 'attention', 'contribution' or a score tensor; got {ranking!r}.")
    return torch.where(candidates, score.clamp_min(torch.finfo(score.dtype).min), -torch.inf)


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
            if n_value == 1:  # the selected point is the aggregate: D = 0 exactly
                dist.scatter_(-1, top, (-agg_sq).expand(-1, -1, -1, 1))
        else:
            dist = 1 - proj * alpha / (y_norm * agg_sq.sqrt() + _COS_EPS) + noncand
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
        precision = _precision_from_outside(n_value, outside.to(dist.dtype))
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


def _precision_from_outside(n_value: int, outside: Tensor) -> Tensor:
    """``N / (N + outside)`` correctly rounded (``n / tensor`` would multiply by a reciprocal), so
    every implementation and bound gives the same float for the same counts."""
    denominator = n_value + outside
    return torch.full_like(denominator, n_value) / denominator


def _check_rows(rows: Tensor, visible_mass: Tensor, valid: Tensor) -> None:
    """:func:`_check_distribution` of whole ``[batch, head, q, key]`` rows."""
    _check_distribution(rows.sum(-1), rows.amin(-1) < 0, visible_mass, valid)


def separability_over_rankings(
    pattern: Float[Tensor, "batch head query key"],
    v: Float[Tensor, "batch key kv_head d_head"],
    n: int | Sequence[int],
    scores: Float[Tensor, "repeat batch head q key"],
    **options,
) -> RandomSeparability:
    """Separability under each of several score tensors (one per repeat), and their mean.

    ``scores[r]`` is any ranking :func:`separability` accepts; ``options`` are its other
    arguments. The mean is NaN-aware over repeats, per query.
    """
    grams: dict = {}  # the values are the same in every repeat
    runs = [_separability(pattern, v, n, ranking=score, gram_cache=grams, **options) for score in scores]
    stacked = {
        f.name: torch.stack([getattr(r, f.name) for r in runs])
        for f in fields(Separability) if f.name not in ("n", "query_positions")
    }
    per_repeat = Separability(n=runs[0].n, query_positions=runs[0].query_positions, **stacked)
    means = {name: value.nanmean(0) for name, value in stacked.items() if name != "sink_selected"}
    sink = stacked["sink_selected"].float().mean(0) >= 0.5
    return RandomSeparability(
        per_repeat=per_repeat,
        mean=Separability(n=runs[0].n, query_positions=runs[0].query_positions, sink_selected=sink, **means),
    )


def random_separability(
    pattern: Float[Tensor, "batch head query key"],
    v: Float[Tensor, "batch key kv_head d_head"],
    n: int | Sequence[int],
    *,
    repeats: int = 16,
    generator: torch.Generator | None = None,
    **options,
) -> RandomSeparability:
    """Random baseline (SPEC §3): ``repeats`` uniformly random rankings per (sequence, head, query).

    Within a repeat one random order serves every N (nested sets); each random set is scored
    around its own aggregate. ``options`` are those of :func:`separability` (not ``ranking``).

    >>> g = torch.Generator().manual_seed(0)
    >>> pattern = torch.full((1, 1, 4, 4), 0.25).tril(); pattern /= pattern.sum(-1, keepdim=True)
    >>> random_separability(pattern, torch.randn(1, 4, 1, 2, generator=g), 1, generator=g).mean.f.shape
    torch.Size([1, 1, 4, 1])
    """
    if "ranking" in options:
        raise ValueError("random_separability draws its own rankings; do not pass ranking.")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int ≥ 1; got {repeats!r}.")
    device = generator.device if generator is not None else pattern.device
    # One draw per repeat, in order, so a seeded generator gives the same scores as before.
    scores = torch.stack([torch.rand(pattern.shape, generator=generator, device=device) for _ in range(repeats)])
    return separability_over_rankings(pattern, v, n, scores.to(pattern.device), **options)


def inversion_bounds(sep: Separability) -> tuple[Float[Tensor, "batch head query n"], Float[Tensor, "batch head query n"]]:
    """The assumption-free certificates: ``P_N ≥ N/(N+GInv)``, ``R_N ≥ max(0, N−GInv)/N``.

    Returns ``(precision_lower, recall_lower)`` shaped like ``sep.precision`` (NaN where undefined).

    >>> pattern = torch.tensor([[[[1.0, 0], [0.5, 0.5]]]])
    >>> v = torch.tensor([1.0, 2.0]).view(1, 2, 1, 1)
    >>> p_low, r_low = inversion_bounds(separability(pattern, v, 1))
    >>> p_low[0, 0, 1].tolist(), r_low[0, 0, 1].tolist()
    ([1.0], [1.0])
    """
    n = torch.tensor(sep.n, dtype=sep.inversions.dtype, device=sep.inversions.device)
    # Quotients of exact integers, each rounded once (1 − GInv/N rounds twice: one ulp above R).
    precision_lower = n / (n + sep.inversions)
    recall_lower = (n - sep.inversions).clamp_min(0) / n
    return precision_lower, recall_lower


@dataclass
class QueryRows:
    """The chosen query rows of one layer, masked and typed for geometry (shared by the sink and
    regime diagnostics, which need whole rows rather than separability's query chunks).

    Attributes:
        qpos: ``[batch, q]`` query positions; ``valid`` ``[batch, q]`` which are real queries.
        alpha: ``[batch, head, q, key]`` weights on visible keys (0 elsewhere).
        visible: ``[batch, q, key]`` keys ``0..t`` that are real, for real queries.
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

    def selection_scores(self, ranking: str | Tensor, exclude_sink: bool = False) -> Float[Tensor, "batch head q key"]:
        """:func:`selection_scores` of the rows (a score tensor must be shaped like the rows)."""
        if isinstance(ranking, Tensor) and ranking.shape != self.alpha.shape:
            raise ValueError(f"ranking scores must be shaped like the chosen rows {tuple(self.alpha.shape)}.")
        value_sq = squared_value_norms(self.values) if isinstance(ranking, str) and ranking == "contribution" else None
        return selection_scores(self.alpha, self.candidates(exclude_sink)[:, None], ranking, value_sq, self.group)


def query_rows(
    pattern: Float[Tensor, "batch head query key"],
    v: Float[Tensor, "batch key kv_head d_head"],
    *,
    queries: str | Tensor = "all",
    key_mask: Bool[Tensor, "batch key"] | None = None,
    query_mask: Bool[Tensor, "batch query"] | None = None,
) -> QueryRows:
    """Validate inputs and gather the chosen query rows (see :class:`QueryRows`)."""
    _check_inputs(pattern, v)
    batch, heads, n_q, n_k = pattern.shape
    device = pattern.device
    dtype = torch.promote_types(torch.promote_types(pattern.dtype, v.dtype), torch.float32)
    key_mask, query_mask = _default_masks(pattern, key_mask, query_mask)
    check_values(v, key_mask)
    qpos = query_positions(query_mask, queries)
    rows = _gather_rows(pattern, qpos).to(dtype)
    valid = query_mask.gather(1, qpos)
    ar = torch.arange(n_k, device=device)
    visible = (ar[None, None, :] <= qpos[:, :, None]) & key_mask[:, None, :] & valid[:, :, None]
    alpha = torch.where(visible[:, None], rows, 0.0)
    _check_rows(rows, alpha.sum(-1), valid)
    values = v.to(dtype).permute(0, 2, 1, 3).contiguous()
    return QueryRows(qpos, valid, alpha, visible, values, values.norm(dim=-1), heads // v.shape[2], key_mask)
