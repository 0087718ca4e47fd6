"""Everything the analysis measures on one layer, behind one small contract with two backends.

:func:`measure_layer` takes a :class:`~tl_geometry.capture.adapters.LayerAttention`, the run's
:class:`~tl_geometry.config.RunConfig` and the random ranking scores, and returns
:class:`LayerMeasures`: named per-query tensors (top-N metrics, random baseline, sink-excluded
F, alignments, certificates), per-row sink statistics, per-kv-head value statistics and the
taxonomy votes. Backends:

- ``"numba"`` (CPU tensors): the values are prepared once (kv-head layout, float64 squared
  norms, one Gram matrix per kv head) and the engine's layer pass over the rows computes
  everything (``_engine.layer``);
- ``"torch"`` (any device): the public functions ``separability``, ``sink_geometry``,
  ``sink_aware_bounds``, ``fit_regime`` and ``vote_counts`` composed, each on its own.

Both give the same numbers (the engine does its scalar arithmetic in float64);
``tests/measure/test_layer_measures.py`` checks it on random inputs and on tiny models of both classes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from .. import _engine as engine
from ..backend import Backend, resolve_backend
from ..config import RunConfig
from . import separability_job
from .certificates import CERTIFICATE_KEYS, certificate_tables, sink_aware_bounds_of, unit_roundoff
from .metrics import inversion_bounds, separability, separability_over_rankings
from .query_rows import (
    check_distribution,
    check_values,
    finite_values,
    query_positions,
    query_rows,
    row_sum_tolerance,
    squared_norm_limit,
    working_dtype,
)
from .random_orders import random_top_orders
from .regime import fit_from_statistics, value_statistics
from .selection import first_visible, squared_value_norms, value_norms64
from .sink import f_by_sink, sink_geometry_of, value_sink_statistics
from .votes import offset_counts, votes_from_winners, winners_of

__all__ = ["LayerMeasures", "RandomDraws", "Workspace", "measure_layer", "PER_KV_FIELDS"]

# Regime-fit fields kept per kv head.
FIT_FIELDS = ("c", "c_spread", "c0", "coherence_max", "coherence_mean", "sink_alignment", "sign_consistency")
PER_KV_FIELDS = ("norm_ratio", "sink_norm", "mean_norm", "sink_cosine", *FIT_FIELDS, "regime_holds")


@dataclass(frozen=True)
class RandomDraws:
    """Uniformly random rankings: ``repeats`` per chosen query, drawn from a counter-based stream
    keyed by ``keys`` ``[batch]`` (one 64-bit key per window and layer, stored in an int64)."""

    keys: Int[Tensor, " batch"]
    repeats: int

    def top_orders(self, key_mask: Tensor, qpos: Tensor, qvalid: Tensor, n_heads: int, max_n: int,
                   exclude_sink: bool, window: int | None = None) -> Int[Tensor, "repeat batch head q max_n"]:
        """The best-``max_n`` sources of every random ranking (-1 past the candidates), as the
        engine's layer pass draws them, on ``key_mask``'s device."""
        return random_top_orders(self.keys, key_mask, qpos, qvalid, n_heads, self.repeats, max_n, exclude_sink,
                                 window)

    def scores(self, key_mask: Tensor, qpos: Tensor, qvalid: Tensor, n_heads: int, max_n: int, exclude_sink: bool,
               window: int | None = None) -> Float[Tensor, "repeat batch head q key"]:
        """Score tensors whose top-``max_n`` are :meth:`top_orders` (for ``separability(ranking=...)``)."""
        orders = self.top_orders(key_mask, qpos, qvalid, n_heads, max_n, exclude_sink, window)
        n_k = key_mask.shape[1]
        scores = torch.zeros(*orders.shape[:-1], n_k + 1, device=orders.device)  # column n_k takes the -1 entries
        rank_scores = torch.arange(max_n, 0, -1, dtype=scores.dtype, device=orders.device).expand_as(orders)
        scores.scatter_(-1, torch.where(orders >= 0, orders, n_k), rank_scores)
        return scores[..., :n_k]


@dataclass
class Workspace:
    """Scratch tensors reused from layer to layer of one run. A fresh tensor of tens of MiB is new
    memory that the kernel must fault in page by page: the paper's 8 × 1024 windows' Gram
    matrices (100 MB a layer) fill a reused buffer in about half the time (docs/performance.md)."""

    _buffers: dict[str, Tensor] = field(default_factory=dict)

    def empty(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """An uninitialised ``shape`` tensor in the buffer ``name`` (grown when too small)."""
        size = math.prod(shape)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.dtype != dtype or buffer.numel() < size:
            buffer = self._buffers[name] = torch.empty(size, dtype=dtype)
        return buffer[:size].view(shape)


@dataclass
class LayerMeasures:
    """What one layer contributes to an analysis.

    Attributes:
        query_positions: ``[batch, q]`` the measured queries.
        per_query: ``{name: [batch, head, q, n]}``: ``precision_top`` … ``f_random``, and with the
            sink diagnostics ``f_nosink``, ``align_sink``, ``align_current``, ``sink_selected``
            (1/0, NaN where undefined), ``f_sink_selected``, ``f_sink_unselected``, the certificates
            ``precision_certificate``/``recall_certificate`` and (Euclidean) ``precision_bound``/``recall_bound``.
        per_row: ``{name: [batch, head, q]}``: ``sink_mass``, ``sink_rank``.
        per_kv: ``{name: [batch, kv]}``: value statistics and the regime fit (``PER_KV_FIELDS``).
        cosine_by_lag: ``[batch, kv, key]`` or None.
        votes: ``[batch, head, 3]`` taxonomy votes; offsets: ``[batch, head, key]``.
        sinkless_votes: ``[batch]`` votes each head cast from rows that could not see the sink.
    """

    query_positions: Int[Tensor, "batch q"]
    per_query: dict[str, Float[Tensor, "batch head q n"]]
    per_row: dict[str, Float[Tensor, "batch head q"]]
    per_kv: dict[str, Float[Tensor, "batch kv"]]
    cosine_by_lag: Float[Tensor, "batch kv key"] | None
    votes: Int[Tensor, "batch head 3"]
    offsets: Int[Tensor, "batch head key"]
    sinkless_votes: Int[Tensor, " batch"] | None = None


def measure_layer(att, config: RunConfig, random: RandomDraws | None, backend: Backend = "auto",
                  workspace: Workspace | None = None) -> LayerMeasures:
    """Measure one layer (see :class:`LayerMeasures`); ``random`` None (or 0 repeats) skips the
    random baseline. ``backend``: see ``tl_geometry.backend``.
    ``workspace``: scratch kept from layer to layer (a run passes one; default: fresh tensors)."""
    backend = resolve_backend(backend, att.pattern.device)
    if random is not None and random.repeats == 0:
        random = None
    # The numba pass checks the values from their squared norms (see _measure_numba).
    if backend == "torch":
        att = replace(att, kv_values=finite_values(att.kv_values, att.key_mask, working_dtype(att.pattern, att.kv_values)))
    if backend == "numba":
        out = _measure_numba(att, config, random, Workspace() if workspace is None else workspace)
    else:
        out = _measure_torch(att, config, random)
    _add_derived(out, config, att.window)
    out.sinkless_votes = _sinkless_votes(att, config)
    return out


def _sinkless_votes(att, config: RunConfig) -> Int[Tensor, " batch"]:
    """Per sequence, the voting rows (real, t > 0) that do not see position 0."""
    qpos = query_positions(att.query_mask, config.taxonomy_queries)
    voting = att.query_mask.gather(1, qpos) & (qpos > 0)
    return (voting & (first_visible(qpos, att.window) > 0)).sum(1).cpu()


def _add_derived(out: LayerMeasures, config: RunConfig, window: int | None) -> None:
    """Entries computed from the top-N metrics alike for both backends. ``sink_selected`` is NaN
    on rows without a visible sink (neither selected nor left out)."""
    q = out.per_query
    if not config.sink:
        return
    has_sink = (first_visible(out.query_positions, window) == 0)[:, None, :, None]
    q["sink_selected"] = torch.where(has_sink, q["sink_selected"], torch.nan)
    top = _as_separability(q, config.n, out.query_positions)
    precision_cert, recall_cert = inversion_bounds(top)
    with_sink, without_sink = f_by_sink(top, window)
    q.update(precision_certificate=precision_cert, recall_certificate=recall_cert,
             f_sink_selected=with_sink, f_sink_unselected=without_sink)


def _as_separability(q: dict[str, Tensor], ns: tuple[int, ...], qpos: Tensor):
    from .metrics import Separability

    return Separability(n=ns, precision=q["precision_top"], recall=q["recall_top"], f=q["f_top"],
                        margin=q["margin"], inversions=q["inversions"], sink_selected=q["sink_selected"] == 1,
                        query_positions=qpos)


def _value_measures(values: Tensor, key_mask: Tensor, config: RunConfig, gram: Tensor | None = None,
                    squares: Tensor | None = None):
    """Per-kv statistics, the regime fit and the certificates' table (shared statistics)."""
    stats = value_statistics(values, key_mask, gram)
    per_kv = value_sink_statistics(stats.norms, stats.cosines, stats.nonsink)
    cosine_by_lag = per_kv.pop("cosine_by_lag")
    fit = fit_from_statistics(stats)
    per_kv.update({name: getattr(fit, name) for name in FIT_FIELDS}, regime_holds=fit.holds().to(values.dtype))
    tables = None
    if config.distance == "euclidean":  # Theorem 1's bounds on the values (Theorem 3 reads its slacks), Theorem 2's on their directions
        roundoff = unit_roundoff(values.dtype, values.device)
        tables = list(certificate_tables(stats, values, roundoff, squares).values())  # form 0, form 1 of the kernel
    return per_kv, cosine_by_lag, tables


def _measure_torch(att, config: RunConfig, random: RandomDraws | None) -> LayerMeasures:
    kv = att.kv_values
    ns = config.n
    masks = {"key_mask": att.key_mask, "query_mask": att.query_mask, "window": att.window}
    opts = {"queries": config.queries, "distance": config.distance, "exclude_sink": config.exclude_sink, **masks}
    top = separability(att.pattern, kv, ns, ranking=config.ranking, backend="torch", **opts)
    q: dict[str, Tensor] = {f"{m}_top": getattr(top, m) for m in ("precision", "recall", "f")}
    q.update(margin=top.margin, inversions=top.inversions,
             sink_selected=torch.where(top.defined, top.sink_selected.to(top.f.dtype), torch.nan))
    if random is not None:
        qvalid = att.query_mask.gather(1, top.query_positions)
        scores = random.scores(att.key_mask, top.query_positions, qvalid, att.pattern.shape[1], max(ns),
                               config.exclude_sink, att.window)
        baseline = separability_over_rankings(att.pattern, kv, ns, scores, backend="torch", **opts).mean
        q.update({f"{m}_random": getattr(baseline, m) for m in ("precision", "recall", "f")})
    per_row: dict[str, Tensor] = {}
    per_kv: dict[str, Tensor] = {}
    cosine_by_lag = None
    # the rows the sink measures, the certificates and (where the queries are the same) the votes read
    rows = query_rows(att.pattern, kv, queries=config.queries, **masks)
    if config.sink:
        geometry = sink_geometry_of(rows, ns, config.ranking, config.exclude_sink)
        q.update(align_sink=geometry.align_sink, align_current=geometry.align_current)
        per_row.update(sink_mass=geometry.sink_mass, sink_rank=geometry.sink_rank)
        values = kv.to(att.pattern.dtype).permute(0, 2, 1, 3)
        per_kv, cosine_by_lag, _ = _value_measures(values, att.key_mask, config)
        q["f_nosink"] = separability(att.pattern, kv, ns, ranking=config.ranking, backend="torch",
                                     **dict(opts, exclude_sink=True)).f
        if config.distance == "euclidean":
            bounds = sink_aware_bounds_of(rows, ns, config.ranking, config.exclude_sink)
            q.update(precision_bound=bounds.precision, recall_bound=bounds.recall)
    if config.taxonomy_queries != config.queries:
        rows = query_rows(att.pattern, kv, queries=config.taxonomy_queries, **masks)
    winners, tax_qpos = winners_of(rows)
    return LayerMeasures(top.query_positions, q, per_row, per_kv, cosine_by_lag,
                         votes_from_winners(winners, tax_qpos), offset_counts(winners, tax_qpos, att.pattern.shape[-1]))


def _measure_numba(att, config: RunConfig, random: RandomDraws | None, workspace: Workspace) -> LayerMeasures:
    pattern, values, value_sq = _numba_inputs(att)
    batch, heads, n_q, n_k = pattern.shape
    n_kv = values.shape[1]
    key_mask, query_mask = att.key_mask.bool().contiguous(), att.query_mask.bool().contiguous()
    last = query_positions(query_mask, "last")[:, 0].contiguous()
    qpos = query_positions(query_mask, config.queries)
    ns = tuple(sorted(set(config.n)))
    want_bounds = config.sink and config.distance == "euclidean"
    repeats = 0 if random is None else random.repeats
    # A Gram matrix V Vᵀ per kv head pays off when many rows × variants read it, and the regime's
    # pair cosines (config.sink) need it anyway. The layer's matrices are held at once up to
    # GRAM_BYTES or half the layer's own pattern (which the forward holds already; the Gram
    # matrices are at most its size): the paper's 1024-token windows keep one block, shared.
    variants = 1 + 2 * config.sink + repeats
    use_gram = config.sink or (heads // n_kv) * qpos.shape[1] * len(ns) * variants >= n_k
    budget = max(separability_job.GRAM_BYTES, pattern.numel() * pattern.element_size() // 2)
    whole_gram = None
    if use_gram and len(separability_job.gram_blocks(batch, n_kv, n_k * n_k * values.element_size(), budget)) == 1:
        whole_gram = torch.matmul(values, values.transpose(-1, -2),
                                  out=workspace.empty("gram", (batch, n_kv, n_k, n_k), values.dtype))
    per_kv, cosine_by_lag, g = _sink_inputs(values, key_mask, config, whole_gram, value_sq)
    # ‖v‖ for the contribution ranking and Theorem 2's weights α‖v‖ (else unread: the squares stand in)
    value_norm64 = value_norms64(values, value_sq) if config.ranking == "contribution" or want_bounds else value_sq
    keys = (np.zeros(batch, dtype=np.uint64) if random is None else random.keys.cpu().numpy().view(np.uint64))
    rule = engine.Rule(np.asarray(ns, dtype=np.int64), 0 if config.ranking == "attention" else 1, config.exclude_sink,
                       config.distance == "euclidean", use_gram, heads // n_kv, att.window or 0)
    plan = engine.LayerPlan(config.queries == "all", config.taxonomy_queries == "all", repeats, config.sink,
                            want_bounds, row_sum_tolerance(att.pattern.dtype),
                            engine.integer_like(pattern.element_size()))
    # values.norm: the taxonomy's ‖v‖, as winner_sources computes it
    rows = engine.LayerRows(pattern, key_mask, query_mask, last, values.norm(dim=-1), g, keys)
    out = _layer_outputs(batch, heads, n_q, n_k, qpos.shape[1], len(ns))

    def buffer(shape):
        return workspace.empty("gram", shape, values.dtype)

    blocks = separability_job.block_grams(values, use_gram, budget, whole=whole_gram, buffer=buffer)
    for b_sl, kv_sl, block, gram in blocks:
        block_rows, block_values, block_out = _block_views(
            rows, engine.Values(block, value_sq, value_norm64, gram), out, rule.group, b_sl, kv_sl)
        engine.layer_rows(block_rows, block_values, rule, plan, block_out)
    if bool(out.tallies.bad_rows.any()):
        _refuse_bad_rows(att, out.checks, query_mask, last, plan.geometry_all or plan.taxonomy_all)
    q, per_row = _per_query(out, config, ns, pattern.dtype, repeats)
    return LayerMeasures(qpos, q, per_row, per_kv, cosine_by_lag, out.tallies.votes, out.tallies.offsets)


def _numba_inputs(att) -> tuple[Tensor, Tensor, Tensor]:
    """The pattern in its working dtype (float32 or float64), contiguous; the values in that dtype
    in the kv-head layout ``[batch, kv, key, d]``, and their float64 squared norms."""
    pattern = att.pattern.detach()
    if pattern.dtype not in (torch.float32, torch.float64):
        pattern = pattern.float()
    pattern = pattern.contiguous()
    values = att.kv_values.detach().to(pattern.dtype).permute(0, 2, 1, 3).contiguous()
    value_sq = squared_value_norms(values)
    # Only where some float64 ‖v‖² is non-finite or too large for the working dtype, check every
    # value (real keys refused) and zero the pads', which take no part.
    if not bool((value_sq <= squared_norm_limit(pattern.dtype, values.shape[-1])).all()):
        values = torch.where(check_values(att.kv_values, att.key_mask, pattern.dtype)[:, None, :, None], values, 0.0)
        value_sq = squared_value_norms(values)
    return pattern, values, value_sq


def _sink_inputs(values: Tensor, key_mask: Tensor, config: RunConfig, gram: Tensor | None, squares: Tensor):
    """Per-kv statistics, the cosines by lag and the certificates' Gram bounds ``[form, key, batch,
    kv, key]`` (zeros unless ``config.sink`` with Euclidean distances)."""
    batch, n_kv, n_k, _ = values.shape
    g = torch.zeros(2, len(CERTIFICATE_KEYS), batch, n_kv, n_k, dtype=torch.float64)
    if not config.sink:
        return {}, None, g
    per_kv, cosine_by_lag, tables = _value_measures(values, key_mask, config, gram, squares)
    if tables is not None:
        g = torch.stack([torch.stack([table[key] for key in CERTIFICATE_KEYS]) for table in tables]).contiguous()
    return per_kv, cosine_by_lag, g


def _layer_outputs(batch: int, heads: int, n_q: int, n_k: int, n_sel: int, n_out: int) -> engine.LayerOutputs:
    """The kernel's outputs, as tensors: per-N ones NaN (undefined until written), counts zero."""

    def full(*shape):
        return torch.full(shape, torch.nan, dtype=torch.float64)

    per_n = (batch, heads, n_sel, n_out)
    return engine.LayerOutputs(
        metrics=engine.Metrics(*(full(*per_n) for _ in range(5)), torch.zeros(per_n, dtype=torch.bool)),
        checks=engine.RowChecks(*torch.zeros(3, batch, heads, n_q, dtype=torch.float64)),
        sink=engine.Sink(full(batch, heads, n_sel), full(batch, heads, n_sel), full(*per_n), full(*per_n), full(*per_n)),
        certificates=engine.Certificates(full(*per_n), full(*per_n)),
        tallies=engine.Tallies(torch.zeros(batch, heads, dtype=torch.int64), torch.zeros(batch, heads, 3, dtype=torch.int64),
                               torch.zeros(batch, heads, n_k, dtype=torch.int64),
                               torch.zeros(3, *per_n, dtype=torch.float64)))


def _block_views(rows: engine.LayerRows, values: engine.Values, out: engine.LayerOutputs, group: int,
                 b_sl: slice, kv_sl: slice) -> tuple[engine.LayerRows, engine.Values, engine.LayerOutputs]:
    """numpy views of one block of the layer's tensors (sequences ``b_sl``, kv heads ``kv_sl`` and
    their query heads), as the kernel takes them; ``values.vectors`` and ``values.gram`` (None:
    no Gram matrices) are the block's own already."""
    h_sl = slice(kv_sl.start * group, kv_sl.stop * group)

    def by_seq(x):
        return x[b_sl].numpy()

    def by_head(x, axis=0):
        return x[(slice(None),) * axis + (b_sl, h_sl)].numpy()

    def by_kv(x, axis=0):
        return x[(slice(None),) * axis + (b_sl, kv_sl)].numpy()

    gram = values.vectors.new_empty(0, 0, 0, 0) if values.gram is None else values.gram
    return (engine.LayerRows(by_head(rows.pattern), by_seq(rows.key_mask), by_seq(rows.query_mask), by_seq(rows.last),
                             by_kv(rows.norms), by_kv(rows.certificates, 2), rows.random_keys[b_sl]),
            engine.Values(values.vectors.numpy(), by_kv(values.squares), by_kv(values.norms64), gram.numpy()),
            engine.LayerOutputs(
                engine.Metrics(*map(by_head, out.metrics)), engine.RowChecks(*map(by_head, out.checks)),
                engine.Sink(*map(by_head, out.sink)), engine.Certificates(*map(by_head, out.certificates)),
                engine.Tallies(*map(by_head, out.tallies[:3]), by_head(out.tallies.random_sum, 1))))


def _refuse_bad_rows(att, checks: engine.RowChecks, query_mask: Tensor, last: Tensor, every: bool) -> None:
    """A visited real row failed a distribution check in the kernel: name the fault (the visited
    rows are every query with ``every``, else the last)."""
    batch, heads, n_q = checks.total.shape
    rows = torch.arange(n_q)[None].expand(batch, -1) if every else last[:, None]
    gather = rows[:, None, :].expand(batch, heads, -1)
    total, negatives, visible = (x.gather(2, gather) for x in checks)
    check_distribution(total, negatives > 0, visible, query_mask.gather(1, rows), att.pattern.dtype)
    raise AssertionError("the numba pass flagged a row that check_distribution accepts")


def _per_query(out: engine.LayerOutputs, config: RunConfig, ns: tuple[int, ...], dtype: torch.dtype,
               repeats: int) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The kernel's outputs as :class:`LayerMeasures`' per-query and per-row tensors, in ``dtype``
    and the caller's order of N."""
    # The kernel's columns are the distinct N in increasing order; back to the caller's order
    # only where it differs (an index_select over the last axis costs far more than the cast).
    columns = None if ns == config.n else torch.tensor([ns.index(value) for value in config.n])

    def finish(x: Tensor) -> Tensor:
        return (x if columns is None else x.index_select(-1, columns)).to(dtype)

    top = out.metrics
    defined = ~torch.isnan(top.precision)
    q: dict[str, Tensor] = {f"{m}_top": finish(getattr(top, m)) for m in ("precision", "recall", "f")}
    q.update(margin=finish(top.margin), inversions=finish(top.inversions),
             sink_selected=finish(torch.where(defined, top.sink_selected.double(), torch.nan)))
    if repeats:
        for i, m in enumerate(("precision", "recall", "f")):
            q[f"{m}_random"] = finish(torch.where(defined, out.tallies.random_sum[i] / repeats, torch.nan))
    per_row: dict[str, Tensor] = {}
    if config.sink:
        q.update(align_sink=finish(out.sink.align_sink), align_current=finish(out.sink.align_current),
                 f_nosink=finish(out.sink.f_nosink))
        per_row = {"sink_mass": out.sink.mass.to(dtype), "sink_rank": out.sink.rank.to(dtype)}
        if config.distance == "euclidean":
            q.update(precision_bound=finish(out.certificates.precision), recall_bound=finish(out.certificates.recall))
    return q, per_row
