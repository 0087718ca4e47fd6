"""Geometric precision, recall and F-score of top-N attention selection (docs/metrics.md#separability).

Framework-free: every function here takes raw tensors. For one query ``t`` with visible
sources ``0..t`` (``t − window + 1 .. t`` in a sliding-window layer) and contributions ``y_i = α[t,i]·v_i``, the top-N set ``S`` under a ranking
has aggregate ``s_N = Σ_{i∈S} y_i`` and distances ``D_i = d(y_i, s_N)``; then::

    ρ_max = max_{i∈S} D_i      ρ_min = min_{j∉S} D_j
    P_N = N / (N + #{j∉S : D_j ≤ ρ_max})      R_N = #{i∈S : D_i < ρ_min} / N
    F_N = 2PR/(P+R) (0 when R = 0)            γ_N = ρ_min − ρ_max
    GInv_N = Σ_{i∈S} Σ_{j∉S} 1{D_j ≤ D_i}

Speed: distances need only ``‖y_i‖² = α_i²‖v_i‖²``, ``⟨y_i, s_N⟩ = α_i⟨v_i, s_N⟩`` and
``‖s_N‖²``, and top-N sets are nested. The arguments are checked once (``query_rows``) into a
job that one of two backends computes: ``separability_numba`` for CPU tensors (a numba kernel,
one query row at a time, Gram-matrix updates per new source) and ``separability_torch``
elsewhere (vectorised over query chunks). Nothing loops over heads or queries in Python.

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

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ..backend import Backend, resolve_backend
from ..config import Distance, Queries, Ranking
from ..errors import TLGeometryError
from .query_rows import as_n_tuple
from .separability_job import SeparabilityJob, prepare_separability
from .separability_torch import CHUNK_ELEMENTS, separability_torch

__all__ = [
    "Separability",
    "RandomSeparability",
    "separability",
    "random_separability",
    "separability_over_rankings",
    "inversion_bounds",
]

@dataclass
class Separability:
    """Per-query separability of top-N sets. Float fields are ``[batch, head, query, len(n)]``
    (with a leading ``repeat`` axis in :class:`RandomSeparability`'s ``per_repeat``).

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
    precision: Float[Tensor, "*repeat batch head query n"]
    recall: Float[Tensor, "*repeat batch head query n"]
    f: Float[Tensor, "*repeat batch head query n"]
    margin: Float[Tensor, "*repeat batch head query n"]
    inversions: Float[Tensor, "*repeat batch head query n"]
    sink_selected: Bool[Tensor, "*repeat batch head query n"]
    query_positions: Int[Tensor, "batch query"]

    @property
    def defined(self) -> Bool[Tensor, "*repeat batch head query n"]:
        """Where the metrics are defined (1 ≤ N < number of candidate sources)."""
        return ~torch.isnan(self.precision)


@dataclass
class RandomSeparability:
    """Random-ranking baseline (docs/metrics.md#random-baseline): ``per_repeat`` fields ``[repeat, batch, head, query, n]``.

    ``mean`` is a :class:`Separability` averaged over repeats (NaN-aware); its ``sink_selected``
    is True where the sink was selected in at least half of the repeats.
    """

    per_repeat: Separability
    mean: Separability


def separability(
    pattern: Float[Tensor, "batch head query key"],
    v: Float[Tensor, "batch key kv_head d_head"],
    n: int | Sequence[int],
    *,
    distance: Distance = "euclidean",
    ranking: Ranking | Tensor = "attention",
    queries: Queries | Tensor = "all",
    exclude_sink: bool = False,
    key_mask: Bool[Tensor, "batch key"] | None = None,
    query_mask: Bool[Tensor, "batch query"] | None = None,
    window: int | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
    backend: Backend = "auto",
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
        window: the layer's sliding window: query ``t`` sees keys ``t − window + 1 .. t`` only
            (default None: its whole causal prefix). Keys out of view are no candidates of any
            statistic, and a row whose window has left position 0 behind has no sink.
        chunk_elements: torch backend: bound on ``batch·head·query_chunk·key`` per working tensor.
        backend: ``"auto"`` (the numba kernel for CPU tensors, torch otherwise),
            ``"numba"`` or ``"torch"``. Both implement the same definitions; see docs/performance.md.

    Returns:
        :class:`Separability` with ``[batch, head, query, len(n)]`` fields, computed in float32
        or wider (float64 inputs stay float64).
    """
    return _separability(pattern, v, n, distance=distance, ranking=ranking, queries=queries,
                         exclude_sink=exclude_sink, key_mask=key_mask, query_mask=query_mask, window=window,
                         chunk_elements=chunk_elements, backend=backend)


def _separability(pattern, v, n, *, distance="euclidean", ranking="attention", queries="all", exclude_sink=False,
                  key_mask=None, query_mask=None, window=None, chunk_elements=CHUNK_ELEMENTS, backend="auto",
                  gram_cache=None):
    """:func:`separability`; ``gram_cache`` (a dict) lets calls on the same values share Gram matrices."""
    ns = as_n_tuple(n)
    job = prepare_separability(pattern, v, ns, distance=distance, ranking=ranking, queries=queries,
                               exclude_sink=exclude_sink, key_mask=key_mask, query_mask=query_mask, window=window)
    out = _run_backend(job, backend, chunk_elements, gram_cache)
    if job.ns != ns:  # the backends work on the distinct N in increasing order
        columns = torch.tensor([job.ns.index(value) for value in ns], device=pattern.device)
        out = {name: value.index_select(-1, columns) for name, value in out.items()}
    return Separability(n=ns, query_positions=job.qpos, **out)


def _run_backend(job: SeparabilityJob, backend: Backend, chunk_elements: int, gram_cache: dict | None):
    """The job on the chosen backend (see ``tl_geometry.backend``)."""
    if resolve_backend(backend, job.pattern.device) == "numba":
        from .separability_numba import separability_numba

        return separability_numba(job, gram_cache=gram_cache)
    return separability_torch(job, chunk_elements=chunk_elements)


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
    """Random baseline (docs/metrics.md#random-baseline): ``repeats`` uniformly random rankings per (sequence, head, query).

    Within a repeat one random order serves every N (nested sets); each random set is scored
    around its own aggregate. ``options`` are those of :func:`separability` (not ``ranking``).

    >>> g = torch.Generator().manual_seed(0)
    >>> pattern = torch.full((1, 1, 4, 4), 0.25).tril(); pattern /= pattern.sum(-1, keepdim=True)
    >>> random_separability(pattern, torch.randn(1, 4, 1, 2, generator=g), 1, generator=g).mean.f.shape
    torch.Size([1, 1, 4, 1])
    """
    if "ranking" in options:
        raise TLGeometryError("random_separability draws its own rankings; do not pass ranking.")
    if not isinstance(repeats, int) or repeats < 1:
        raise TLGeometryError(f"repeats must be an int ≥ 1; got {repeats!r}.")
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
