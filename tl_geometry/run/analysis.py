"""One streamed pass for notebooks: separability, sink diagnostics, regime fit and taxonomy.

Example:
    >>> import tl_geometry as tlg
    >>> res = tlg.analyze(model, ["The cat sat on the mat.", "Paris is the capital of France."])  # doctest: +SKIP
    >>> res.taxonomy.heads("mixer")[:3]                                                       # doctest: +SKIP
    [(0, 1), (0, 4), (1, 0)]
    >>> res.geometry.mean("gap").shape, res.heads_table().columns[:6].tolist()              # doctest: +SKIP
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from ..capture.adapters import (
    batched_cache,
    bos_flags,
    check_attention_mask,
    describe_cache,
    describe_model,
    hook_names,
    is_cache,
    pad_token_id,
    read_layer,
    stream_layers,
    unexplained_window,
)
from ..capture.hooks import warn_hooks_left
from ..config import Distance, Queries, Ranking, RunConfig
from ..errors import TLGeometryError
from ..io import check_sealed, head_name, parse_head, parse_heads, token_digest
from ..label.head_types import HEAD_TYPES, HEAD_TYPES_FILE, HeadTypes, auto_length
from ..label.head_types import head_types as measure_head_types
from ..label.taxonomy import REGIMES, HeadTaxonomy, TaxonomyAccumulator
from ..measure.layer_measures import Workspace, measure_layer
from ..measure.query_rows import as_n_tuple
from ..measure.votes import VOTES
from .checkpoint import KeyedCheckpoint
from .distributed import all_gather_objects, all_reduce, shard_indices, shard_path, world
from .geometry import GeometryResult, SeparabilityAccumulator

__all__ = ["Analysis", "analyze", "tokenize_texts"]

# Euclidean N = 1 selects the aggregate itself: these are 1 (the gap 0) unless contributions coincide.
FIXED_AT_ONE = frozenset({"f_top", "f_random", "gap", "f_nosink", "f_sink_selected", "f_sink_unselected",
                          "precision_bound", "recall_bound"})
# Below this many votes a head's Wilson 95% interval is wider than ±0.1 around an even share.
FEW_VOTES = 100


@dataclass
class Analysis:
    """Everything one pass measured. ``geometry`` holds separability (top-N vs random), the sink
    diagnostics and the regime certificates per sequence; ``taxonomy`` the head regimes."""

    geometry: GeometryResult
    taxonomy: HeadTaxonomy
    head_types: HeadTypes | None = None

    def __repr__(self) -> str:
        types = (repr(self.head_types) if self.head_types is not None else
                 "None  # not measured (a cache, or head_types=False): res.with_head_types(tlg.head_types(model))")
        return f"Analysis(\n  geometry={self.geometry!r},\n  taxonomy={self.taxonomy!r},\n  head_types={types})"

    def with_head_types(self, head_types: HeadTypes) -> Analysis:
        """This analysis with TransformerLens's head-type scores of the same model attached
        (``tlg.head_types(model)``): they join :meth:`heads_table`, the saved run and the report."""
        if not isinstance(head_types, HeadTypes):
            raise TLGeometryError(f"with_head_types takes tlg.head_types(model), got {type(head_types).__name__}.")
        if head_types.shape != tuple(self.taxonomy.shape):
            raise TLGeometryError(f"head types of {head_types.shape[0]}×{head_types.shape[1]} heads do not fit an "
                                  f"analysis of {self.taxonomy.shape[0]}×{self.taxonomy.shape[1]}: measure both on "
                                  "one model.")
        return replace(self, head_types=head_types)

    def head_profile(self, head: Any) -> str:
        """One line on one head (a pair, ``"L3H4"`` or a flat index): its regime and vote shares,
        the dominant offset of its winners, and with head types attached their scores."""
        layer, index = parse_head(head, *self.taxonomy.shape)
        tax = self.taxonomy
        shares = " ".join(f"{vote} {float(tax.shares[layer, index, i]):.2f}" for i, vote in enumerate(VOTES))
        line = f"{head_name(layer, index)}: {tax.labels[layer, index]} (votes: {shares})"
        if tax.offsets is not None and int(tax.dominant_offset[layer, index]) >= 0:
            offset = int(tax.dominant_offset[layer, index])
            line += f"; other winners most often {offset} token{'s' if offset != 1 else ''} back"
        if self.head_types is not None:
            scores = ", ".join(f"{kind.replace('_', '-')} {float(getattr(self.head_types, kind)[layer, index]):.2f}"
                               for kind in HEAD_TYPES)
            kind = self.head_types.labels()[layer, index]
            line += f"; TransformerLens scores: {scores} ({'no familiar type' if kind == 'other' else kind.replace('_', '-') + ' head'})"
        return line

    def heads_table(self, heads: Any = None, extra: dict[str, Any] | None = None, *, all_columns: bool = False):
        """One row per head: layer, head, name, regime, vote shares (where sliding windows hid the sink
        from some voting rows, ``share_sinkless``: their share of the votes), dominant offset (with head types
        attached: the previous-token / duplicate-token / induction scores and the type), then F_N
        top-N / random / gap per N and, when measured, the sink statistics; ``n_votes``,
        ``share_low``/``share_high`` (the Wilson 95% interval of the winning share) and
        ``label_uncertain`` (the runner-up's interval reaches it) say what each label rests on. A DataFrame whose rows
        are layer-major (L0H0, L0H1, …, the order of TransformerLens's flat head index); ``heads``
        keeps those heads only, in their order (pairs, ``"L3H4"`` names, flat indices, a boolean
        ``[n_layers, n_heads]`` mask: ``io.parse_heads``). ``extra`` joins columns of your own by
        head, whatever ``heads`` selects: ``{"patch": tensor}`` with a ``[n_layers, n_heads]``
        tensor (or its flat ``[n_layers·n_heads]`` form), e.g. an activation-patching result.
        Columns fixed by the definition are left out unless ``all_columns=True`` (the run folder's
        heads.csv keeps them): in a Euclidean run the ``@1`` columns of F (top, random, without the
        sink, sink selected or not), the gap and the certificates, which are 1 (the gap 0) unless
        two contributions coincide (docs/metrics.md). ``frame.attrs`` says whether the windows
        start with BOS (``bos``, ``windows_without_bos``) and which layers slide
        (``sliding_windows``)."""
        import pandas as pd

        geo, tax = self.geometry, self.taxonomy
        layers, heads_per_layer = tax.shape
        grid = torch.cartesian_prod(torch.arange(layers), torch.arange(heads_per_layer))
        table: dict[str, Any] = {"layer": grid[:, 0].numpy(), "head": grid[:, 1].numpy()}
        table["name"] = [head_name(a, b) for a, b in grid.tolist()]
        table["regime"] = tax.labels.reshape(-1)
        for i, vote in enumerate(VOTES):
            table[f"share_{vote}"] = tax.shares[..., i].reshape(-1).double().numpy()
        # the label's evidence: its votes, the Wilson 95% interval of the winning share, and whether
        # the runner-up's interval reaches it (the label could flip with other windows)
        table["n_votes"] = tax.n_votes.reshape(-1).numpy()
        low, high = tax.share_interval
        table["share_low"], table["share_high"] = low.reshape(-1).numpy(), high.reshape(-1).numpy()
        table["label_uncertain"] = tax.label_uncertain.reshape(-1).numpy()
        if tax.sinkless is not None and bool(tax.sinkless.any()):  # sliding windows: votes without the sink in view
            table["share_sinkless"] = tax.sinkless_share.reshape(-1).numpy()
        offset = tax.dominant_offset.reshape(-1).numpy()
        table["dominant_offset"] = pd.Series(offset, dtype="Int64").where(offset >= 0).array  # NA: no `other` vote
        if self.head_types is not None:
            for kind in HEAD_TYPES:
                table[kind] = getattr(self.head_types, kind).reshape(-1).double().numpy()
            table["head_type"] = self.head_types.labels().reshape(-1)
        by_n = ["f_top", "f_random", "gap"]
        if geo.has_sink:
            for metric in ("norm_ratio", "sink_cosine", "sink_mass", "c_spread", "coherence_max", "regime_holds"):
                table[metric] = geo.mean(metric).reshape(-1).double().numpy()
            by_n += ["f_nosink", "f_sink_selected", "f_sink_unselected", "align_sink", "align_current",
                     "precision_bound", "recall_bound"]
        for metric in by_n:
            values = geo.mean(metric).reshape(layers * heads_per_layer, -1)
            for index, n in enumerate(geo.n):
                if all_columns or not (n == 1 and metric in FIXED_AT_ONE and geo.settings.get("distance") == "euclidean"):
                    table[f"{metric}@{n}"] = values[:, index].double().numpy()
        for name, values in (extra or {}).items():
            if name in table:
                raise TLGeometryError(f"extra column {name!r} is one of the table's own: name it otherwise.")
            table[name] = self._per_head(values, f"extra[{name!r}]").reshape(-1).numpy()
        frame = pd.DataFrame(table)
        frame.attrs.update(bos=geo.bos_line(), windows_without_bos=geo.windows_without_bos,
                           sliding_windows=dict(geo.settings.get("sliding_windows") or {}))
        if heads is None:
            return frame
        return frame.iloc[[a * heads_per_layer + b for a, b in parse_heads(heads, layers, heads_per_layer)]]

    def _per_head(self, values: Any, what: str) -> Tensor:
        """A per-head quantity of the caller's as a float64 ``[n_layers, n_heads]`` tensor (from that
        shape or the flat, layer-major ``[n_layers·n_heads]``), or one line saying what fits."""
        layers, heads = self.taxonomy.shape
        tensor = torch.as_tensor(values).detach().cpu()
        if tensor.is_complex() or tensor.dtype == torch.bool or tensor.numel() != layers * heads or (
                tensor.ndim == 2 and tuple(tensor.shape) != (layers, heads)) or tensor.ndim not in (1, 2):
            raise TLGeometryError(f"{what} must be one number per head, [n_layers, n_heads] = [{layers}, {heads}] "
                                  f"(or flat [{layers * heads}], layer-major); got shape {list(tensor.shape)}"
                                  f"{'' if tensor.dtype != torch.bool else ' of booleans'}.")
        return tensor.double().reshape(layers, heads)

    def regime_means(self, metric: str | Any):
        """A per-head quantity aggregated within each regime. ``metric`` a geometry metric's name
        (e.g. ``"align_sink"`` for C7): its mean, a DataFrame indexed by regime with one column per
        N where the metric has an N axis. Or a tensor of your own, ``[n_layers, n_heads]`` (or flat,
        layer-major), e.g. an activation-patching result: columns ``count``, ``mean`` and ``sum``
        (NaN entries skipped)."""
        import pandas as pd

        if not isinstance(metric, str):
            values = self._per_head(metric, "regime_means' tensor")
            ids = self.taxonomy.label_ids
            rows = {}
            for i, regime in enumerate(REGIMES):
                chosen = values[(ids == i) & ~values.isnan()]
                rows[regime] = [int(chosen.numel()), float(chosen.mean()) if chosen.numel() else float("nan"),
                                float(chosen.sum())]
            return pd.DataFrame.from_dict(rows, orient="index", columns=["count", "mean", "sum"])
        values = self.geometry.mean(metric)
        ids = self.taxonomy.label_ids
        rows = {}
        for i, regime in enumerate(REGIMES):
            chosen = values[ids == i]
            rows[regime] = chosen.nanmean(0).tolist() if chosen.numel() else [float("nan")] * max(1, values[0, 0].numel())
        columns = [f"N={n}" for n in self.geometry.n] if values.ndim == 3 else [metric]
        return pd.DataFrame.from_dict(rows, orient="index", columns=columns)

    def merge(self, other: Analysis) -> Analysis:
        """Results of two disjoint sets of windows (any split, any order) as one run's."""
        return Analysis(self.geometry.merge(other.geometry), self.taxonomy.merge(other.taxonomy),
                        self.head_types if self.head_types is not None else other.head_types)

    def save(self, folder: str | Path, *, overwrite: bool = False) -> None:
        """Write a finished run folder, as ``tl-geometry analyze`` does (results, tables, settings,
        manifest), so ``tl-geometry report``, ``prune``, ``stream``, ``compare`` and
        :meth:`load` take it. ``folder`` must be new, empty or a run folder; a finished analysis
        there is replaced only with ``overwrite=True`` (with the tables derived from it), and a
        folder of other files is refused. Nothing is deleted that tl-geometry did not write."""
        from .run_folder import RunFolder

        run = RunFolder(folder, api=True)
        run.check_new_analysis(overwrite=overwrite, resume=False)
        with run.writing(elsewhere=True):
            run.check_new_analysis(overwrite=overwrite, resume=False)  # again, under the lock
            run.write_analysis(self, self.geometry.settings, {})
            run.drop_stale_checkpoint()  # an interrupted run's state: its analysis is the one replaced

    @classmethod
    def load(cls, folder: str | Path) -> Analysis:
        folder = Path(folder)
        check_sealed(folder)  # a run folder: only a finished analysis whose files match its manifest
        geometry = GeometryResult.load(folder / "geometry.safetensors")
        taxonomy = HeadTaxonomy.load(folder / "taxonomy.safetensors")
        heads = (geometry.n_layers, geometry.n_heads) if geometry.per_sequence else None
        if heads is not None and heads != tuple(taxonomy.shape):
            raise TLGeometryError(f"{str(folder)!r} holds results of two analyses: geometry of {heads[0]}×{heads[1]} "
                                  f"heads beside a taxonomy of {taxonomy.shape[0]}×{taxonomy.shape[1]}; rerun "
                                  "tl-geometry analyze into a new folder")
        analysis = cls(geometry, taxonomy)
        if (folder / HEAD_TYPES_FILE).is_file():
            analysis = analysis.with_head_types(HeadTypes.load(folder / HEAD_TYPES_FILE))
        return analysis


def tokenize_texts(model: Any, texts: Sequence[str]) -> tuple[Int[Tensor, "seq pos"], Int[Tensor, "seq pos"]]:
    """BOS + each text's tokens (no other special tokens), right-padded: ``(tokens, attention_mask)``."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise TLGeometryError("the model has no tokenizer: pass token ids [seq, pos] instead of texts.")
    if tokenizer.bos_token_id is None:
        raise TLGeometryError("the tokenizer has no BOS token; geometry needs the sink at position 0. Pass token ids.")
    ids = [[tokenizer.bos_token_id, *tokenizer(text, add_special_tokens=False)["input_ids"]] for text in texts]
    if len(texts) > 1 and (texts[0] == getattr(tokenizer, "bos_token", None) or all(len(row) <= 2 for row in ids)):
        raise TLGeometryError("these strings look like string tokens (model.to_str_tokens output), one window each: "
                              "pass the token ids (model.to_tokens(text)) or the texts themselves.")
    length = max(len(row) for row in ids)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.bos_token_id
    tokens = torch.full((len(ids), length), pad, dtype=torch.long)
    mask = torch.zeros(len(ids), length, dtype=torch.long)
    for i, row in enumerate(ids):
        tokens[i, :len(row)] = torch.tensor(row)
        mask[i, :len(row)] = 1
    return tokens, mask


class Checkpoint:
    """The state of a streamed analysis (a :class:`~tl_geometry.checkpoint.KeyedCheckpoint`): the
    per-sequence values and votes of the batches done so far. A run killed at any moment loses at
    most the batch in flight; a checkpoint of other settings is refused before the first batch."""

    def __init__(self, path: str | Path, key: dict[str, Any]):
        self.file = KeyedCheckpoint(path, key, "analysis")

    def restore(self, geometry: SeparabilityAccumulator, taxonomy: TaxonomyAccumulator) -> int:
        """Load the saved state into the accumulators; returns the number of windows done."""
        tensors, _ = self.file.load()
        if not tensors:
            return 0
        ids = tensors.pop("window_ids")
        taxonomy.votes, taxonomy.offsets = tensors.pop("votes"), tensors.pop("offsets")
        taxonomy.sinkless = tensors.pop("sinkless_votes", torch.zeros_like(taxonomy.votes[..., 0]))
        geometry.batches, geometry.window_ids = [tensors], [ids]
        return int(ids.numel())

    def save(self, geometry: SeparabilityAccumulator, taxonomy: TaxonomyAccumulator) -> None:
        tensors = {k: torch.cat([b[k] for b in geometry.batches]) for k in geometry.batches[0]}
        tensors.update(window_ids=torch.cat(geometry.window_ids), votes=taxonomy.votes, offsets=taxonomy.offsets,
                       sinkless_votes=taxonomy.sinkless)
        self.file.save(tensors)


def _stream_windows(model, info, tokens, attention_mask, batch_size, progress, on_layer, on_batch=None,
                    after_batch=None, first: int = 0) -> None:
    """Stream the model over the windows ``first..`` batch by batch (tqdm bar per batch)."""
    from tqdm.auto import tqdm

    from .._engine import kernels_cached

    starts = range(first, tokens.shape[0], batch_size)
    desc = "windows" if kernels_cached() else "windows (compiling kernels, once per installation: about a minute)"
    bar = tqdm(starts, desc=desc, unit="batch", disable=not progress, initial=0)
    for start in bar:
        rows = slice(start, start + batch_size)
        if on_batch is not None:
            on_batch(rows)
        mask = None if attention_mask is None else attention_mask[rows]
        stream_layers(model, tokens[rows], on_layer, attention_mask=mask, info=info)
        bar.set_description("windows", refresh=False)
        if after_batch is not None:
            after_batch()


def _warn_not_measurable(config: RunConfig, tokens: Tensor, attention_mask: Tensor | None) -> None:
    """Refuse a run where no N can be measured; warn of the N that will be NaN and why."""
    longest = int(tokens.shape[1] if attention_mask is None else attention_mask.sum(1).max())
    if len(config.unmeasurable_n(longest)) == len(config.n):
        raise TLGeometryError(f"no N in {list(config.n)} is measurable on sequences of at most {longest} tokens: "
                              "N must be fewer than a query's candidate sources; pass smaller n or longer texts.")
    if config.unmeasurable_n(longest):  # the first reason; a skipped baseline (repeats=0) was asked for
        warnings.warn(f"results will be NaN for {config.not_measurable(longest)[0]}.", stacklevel=3)


def _warn_unmasked_padding(tokens: Tensor, attention_mask: Tensor | None, pad: int | None) -> None:
    """Warn when windows look right-padded (they end in the pad id, in runs or in some rows only)
    and no attention mask says so: the pads would be measured as real tokens."""
    if attention_mask is not None or pad is None:
        return
    ends = tokens[:, -1] == pad
    runs = ends & (tokens[:, -2] == pad)
    if bool(runs.any()) or (bool(ends.any()) and not bool(ends.all())):
        warnings.warn(f"{int(ends.sum())} of {tokens.shape[0]} windows end in the pad token id {pad} and no "
                      "attention_mask was given: pads would be measured as real tokens. Pass attention_mask= "
                      "(1 for real tokens) to tlg.analyze, and to run_with_cache when you analyse its cache.",
                      stacklevel=3)


def _bos_record(tokens: Tensor | None, attention_mask: Tensor | None, bos_token_id: int | None, window_ids: Tensor,
                from_cache: bool) -> dict[str, Any]:
    """Whether each window starts with the model's BOS, for the results' settings
    (``{"known": bool, "without": [window ids]}``). Told where the caller can act: the windows that
    lack a BOS the tokenizer has (and how to prepend it), or a cache analysed without the tokens
    that would tell. A model without a BOS id has none to miss: its results say "BOS unknown"."""
    flags = bos_flags(tokens, attention_mask, bos_token_id)
    if flags is None:
        if from_cache and tokens is None and bos_token_id is not None:
            warnings.warn("cannot tell whether the cached windows start with BOS without their tokens: position 0 is "
                          "taken as the sink. Pass the tokens, tlg.analyze(cache, tokens), to have it checked.",
                          stacklevel=3)
        return {"known": False, "without": []}
    without = window_ids[~flags].tolist()
    if without:
        warnings.warn(f"{len(without)} of {len(flags)} windows {'does' if len(without) == 1 else 'do'} not start with the BOS token (id {bos_token_id}; "
                      f"windows {without[:5]}{' …' if len(without) > 5 else ''}): their sink statistics and mixer "
                      "labels describe their first content token. Prepend BOS: model.to_tokens(text) does "
                      "(prepend_bos=True), or torch.cat([torch.full((n, 1), model.tokenizer.bos_token_id), tokens], 1).",
                      stacklevel=3)
    return {"known": True, "without": without}


def _warn_few_votes(taxonomy: HeadTaxonomy) -> None:
    """Warn once per run when the labels rest on few votes: how many, how many labels could flip."""
    counts = taxonomy.n_votes[taxonomy.n_votes > 0]
    if counts.numel() == 0 or int(counts.min()) >= FEW_VOTES:
        return
    uncertain = int(taxonomy.label_uncertain.sum())
    warnings.warn(f"the regime labels rest on as few as {int(counts.min())} votes per head (one per taxonomy query "
                  f"of each window); {uncertain} of {taxonomy.n_votes.numel()} labels could flip within their 95% "
                  "interval (heads_table()'s label_uncertain). Analyse more text, ≥ "
                  f"{FEW_VOTES} votes per head, for firmer labels.", stacklevel=3)


def _warn_unexplained_window(layer: int, att: Any, warned: set[int]) -> None:
    """Warn once per layer where the pattern itself looks windowed and no configuration said so."""
    window = unexplained_window(att)
    if window is not None:
        warned.add(layer)
        declared = att.window
        warnings.warn(f"layer {layer}: every head's last query gives weight exactly 0 to each position before its "
                      f"last {window}, as a sliding window of {window} would, but the model's configuration declares "
                      f"{'a window of ' + str(declared) if declared else 'none'}: positions out of that view are "
                      "measured as sources. Check the model's attention (a custom mask or an undeclared window).",
                      stacklevel=4)


def _check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise TLGeometryError(f"batch_size must be an int ≥ 1 (windows per forward pass); got {batch_size!r}.")


def _as_tokens(model, tokens_or_texts, attention_mask):
    if isinstance(tokens_or_texts, str):
        tokens_or_texts = [tokens_or_texts]
    if type(tokens_or_texts).__module__ == "numpy":  # token ids from numpy: same meaning
        tokens_or_texts = torch.as_tensor(tokens_or_texts)
    if isinstance(tokens_or_texts, Tensor):
        tokens = tokens_or_texts if tokens_or_texts.ndim == 2 else tokens_or_texts[None]
        if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
            raise TLGeometryError(f"token ids must be integers; got a {tokens.dtype} tensor (texts? pass a list of str).")
        if attention_mask is not None:
            attention_mask = torch.as_tensor(attention_mask)
            check_attention_mask(attention_mask, *tokens.shape)
            empty = (~attention_mask.bool().any(1)).nonzero().flatten().tolist()
            if empty:
                raise TLGeometryError(f"attention_mask rows {empty[:5]} have no real token: drop those sequences.")
        return tokens, attention_mask
    texts = list(tokens_or_texts)
    if not texts or not all(isinstance(t, str) for t in texts):
        raise TLGeometryError("pass token ids [seq, pos] or a non-empty list of strings.")
    if attention_mask is not None:
        raise TLGeometryError("attention_mask is built from the texts; pass it only with token ids.")
    return tokenize_texts(model, texts)


def _cache_tokens(cache, tokens_or_texts, attention_mask) -> tuple[Tensor, Tensor | None]:
    """The token ids (or, without them, placeholders of the cached shape) and the attention mask of
    the run a cache came from; shapes checked against the cached pattern."""
    batch, _, pos, _ = cache[hook_names(0)[0]].shape
    if tokens_or_texts is None:  # unknown ids: every sequence is taken to start with BOS
        tokens_or_texts = torch.zeros(batch, pos, dtype=torch.long)
    if isinstance(tokens_or_texts, Tensor) and tokens_or_texts.ndim == 1 and batch == 1:  # remove_batch_dim
        tokens_or_texts = tokens_or_texts[None]
    tokens, attention_mask = _as_tokens(getattr(cache, "model", None), tokens_or_texts, attention_mask)
    if tuple(tokens.shape) != (batch, pos):
        raise TLGeometryError(f"the cache holds {batch} sequences of {pos} positions, but the tokens have shape "
                              f"{tuple(tokens.shape)}: pass those the cache was computed from.")
    return tokens, attention_mask


def _differs(value: Any, default: Any) -> bool:
    """Whether a keyword setting was changed from its default (tensors always count as given)."""
    if isinstance(value, Tensor):
        return True
    if isinstance(value, list | tuple) and isinstance(default, tuple):
        return tuple(value) != default
    return value != default


def analyze(
    model: Any,
    tokens_or_texts: Tensor | np.ndarray | Sequence[str] | str | None = None,
    n: Sequence[int] | int = (1, 2, 4, 8, 16, 32),
    *,
    attention_mask: Int[Tensor, "seq pos"] | None = None,
    queries: Queries = "last",
    taxonomy_queries: Queries = "all",
    distance: Distance = "euclidean",
    ranking: Ranking = "attention",
    exclude_sink: bool = False,
    repeats: int | Literal["auto"] = "auto",
    seed: int = 0,
    batch_size: int = 8,
    window_ids: Int[Tensor, " seq"] | None = None,
    bootstrap: int = 2000,
    sink: bool = True,
    checkpoint: str | Path | None = None,
    distributed: bool | None = None,
    progress: bool = True,
    config: RunConfig | None = None,
    allow_hooks: bool = False,
    head_types: bool = True,
) -> Analysis:
    """Stream ``model`` once over the windows and measure everything (docs/metrics.md), or
    measure a cache you already have.

    Args:
        model: ``HookedTransformer`` or ``TransformerBridge``; or an ``ActivationCache`` from
            ``model.run_with_cache(tokens, names_filter=tlg.names_filter)`` (or a dict keyed by hook
            name) holding ``hook_pattern`` and ``hook_v`` of every layer: then nothing runs again,
            and the results equal those of the model on the same tokens.
        tokens_or_texts: ``[seq, pos]`` token ids (BOS first) or texts (BOS is prepended). With a
            cache: the tokens it came from (optional; they tell whether each sequence starts with
            BOS), and ``attention_mask`` where the run had pads.
        n, queries, taxonomy_queries, distance, ranking, exclude_sink, repeats, seed, bootstrap, sink:
            the run's :class:`~tl_geometry.config.RunConfig` (its docstring says what each means;
            ``repeats="auto"``: 16 random rankings per query for the last query, one per query
            for all queries of 256-token windows). Or pass ``config`` itself (not both: a keyword
            setting beside ``config`` is refused).
        batch_size: windows per forward pass.
        window_ids: global window index of each row (default ``0..seq-1``); shards pass theirs.
        checkpoint: a file updated after every batch; if it exists (same settings and windows) the
            run resumes after its last batch, with results identical to an uninterrupted run.
        distributed: shard the windows over the ranks of the initialised ``torch.distributed``
            process group and merge (default: whenever one is initialised); every rank returns the
            merged result, identical to one process over all windows.
        progress: a tqdm bar per window batch.
        allow_hooks: measure a model that has hooks left attached (``model.add_hook``) without the
            warning; hooks of a context (``model.hooks(...)``, ``run_with_hooks``, tl_geometry's own
            ablations) are deliberate and never warned about.
        head_types: attach TransformerLens's previous-token, duplicate-token and induction scores
            (:func:`~tl_geometry.head_types.head_types`: one more forward, of BOS + 2 × 50 random
            tokens); ``False`` skips it. A cache cannot run that forward: attach them with
            ``res.with_head_types(tlg.head_types(model))``, as ``print(res)`` says.

    Returns:
        :class:`Analysis` with ``geometry`` (``[seq, layer, head, n]`` per-sequence values) and
        ``taxonomy`` (labels ``[layer, head]``).
    """
    settings = dict(n=n, queries=queries, taxonomy_queries=taxonomy_queries, distance=distance, ranking=ranking,
                    exclude_sink=exclude_sink, repeats=repeats, seed=seed, bootstrap=bootstrap, sink=sink)
    if config is None:
        config = RunConfig(**dict(settings, n=as_n_tuple(n)))
    else:  # one source of settings: a keyword beside config= would otherwise be dropped without a word
        defaults = inspect.signature(analyze).parameters
        given = [name for name, value in settings.items() if _differs(value, defaults[name].default)]
        if given:
            raise TLGeometryError(f"pass the settings as config= or as keywords, not both: config= was given with "
                                  f"{', '.join(given)}; use dataclasses.replace(config, ...) to change it.")
    cache = model if is_cache(model) else None
    if cache is not None:
        if checkpoint is not None:
            raise TLGeometryError("a cache is analysed in one step: checkpoint applies to runs of a model.")
        cache = batched_cache(cache)
        info = describe_cache(cache)
        tokens, attention_mask = _cache_tokens(cache, tokens_or_texts, attention_mask)
        if tokens_or_texts is not None:  # a cache keeps its model (ActivationCache.model): its pad id
            _warn_unmasked_padding(tokens, attention_mask, pad_token_id(getattr(cache, "model", None)))
    else:
        if tokens_or_texts is None:
            raise TLGeometryError("pass the token ids [seq, pos] or texts to analyse (or an ActivationCache "
                                  "instead of the model).")
        tokens, attention_mask = _as_tokens(model, tokens_or_texts, attention_mask)
        info = describe_model(model)
        warn_hooks_left(model, allow_hooks)
        _warn_unmasked_padding(tokens, attention_mask, pad_token_id(model))
    if tokens.ndim != 2 or tokens.shape[0] == 0 or tokens.shape[1] < 2:
        raise TLGeometryError(f"need at least one window of ≥ 2 tokens; got shape {tuple(tokens.shape)}.")
    _check_batch_size(batch_size)
    info.check_length(int(tokens.shape[1]))
    _warn_not_measurable(config, tokens, attention_mask)
    window_ids = torch.arange(tokens.shape[0]) if window_ids is None else torch.as_tensor(window_ids)
    bos = _bos_record(tokens if cache is None or tokens_or_texts is not None else None, attention_mask,
                      info.bos_token_id, window_ids, cache is not None)
    rank, world_size = world()
    if cache is None and distributed is not False and world_size > 1:  # this rank's shard; merged at the end
        mine = shard_indices(tokens.shape[0], rank, world_size)
        all_windows = int(tokens.shape[0])
        tokens, window_ids = tokens[mine], window_ids[mine]
        attention_mask = None if attention_mask is None else attention_mask[mine]
        if checkpoint is not None:
            checkpoint = shard_path(checkpoint, rank, world_size)
    else:
        world_size, all_windows = 1, int(tokens.shape[0])
    geometry = SeparabilityAccumulator(info.n_layers, info.n_heads, config)
    taxonomy = TaxonomyAccumulator(info.n_layers, info.n_heads, tokens.shape[1])

    workspace = Workspace()
    unexplained: set[int] = set()  # layers already warned about

    def on_layer(layer, att):
        if layer not in unexplained:
            _warn_unexplained_window(layer, att, unexplained)
        measures = measure_layer(att, config, geometry.random_draws(att), workspace=workspace)
        geometry.add(layer, measures, att.heads_per_kv)
        taxonomy.add_votes(layer, measures.votes, measures.offsets, measures.sinkless_votes)

    def on_batch(rows: slice) -> None:
        geometry.start_batch(window_ids[rows], tokens.shape[1])

    settings = {
        **config.to_dict(), "random_repeats": config.random_repeats(int(tokens.shape[1])),
        "model": info.model_name, "model_class": info.model_class, "dtype": info.dtype,
        "transformer_lens": info.transformer_lens_version, "processing": info.processing,
        "n_windows": all_windows, "seq_len": int(tokens.shape[1]), "bos": bos,
        "sliding_windows": {str(layer): window for layer, window in sorted(info.sliding_windows.items())},
    }
    done, save = 0, None
    if checkpoint is not None:
        state = Checkpoint(checkpoint, {**settings, "batch_size": batch_size, "tokens": token_digest(tokens, attention_mask),
                                        "window_ids": window_ids.tolist()})
        done = state.restore(geometry, taxonomy)
        if done % batch_size and done < tokens.shape[0]:
            raise TLGeometryError(f"checkpoint {str(checkpoint)!r} holds {done} windows, not a whole number of batches.")

        def save() -> None:
            state.save(geometry, taxonomy)

    if cache is not None:
        from tqdm.auto import tqdm

        on_batch(slice(0, tokens.shape[0]))
        for layer in tqdm(range(info.n_layers), desc="layers", disable=not progress):
            on_layer(layer, read_layer(cache, layer, attention_mask=attention_mask,
                                       tokens=None if tokens_or_texts is None else tokens,
                                       bos_token_id=info.bos_token_id, window=info.window(layer)))
    else:
        _stream_windows(model, info, tokens, attention_mask, batch_size, progress and rank == 0, on_layer, on_batch,
                        save, first=done)
    result = Analysis(geometry.result(settings, allow_empty=world_size > 1), taxonomy.result(settings))
    result = gather_analysis(result) if world_size > 1 else result
    if cache is None and head_types and auto_length(model) >= 2:  # the hooks were warned about above
        result = result.with_head_types(measure_head_types(model, allow_hooks=True))
    _warn_few_votes(result.taxonomy)
    return result


def gather_analysis(analysis: Analysis) -> Analysis:
    """Merge the shards of every rank into the result of one run over all windows (on every rank)."""
    size = world()[1]
    if size == 1:
        return analysis
    votes = all_reduce(analysis.taxonomy.votes.clone())
    offsets = all_reduce(analysis.taxonomy.offsets.clone())
    sinkless = None if analysis.taxonomy.sinkless is None else all_reduce(analysis.taxonomy.sinkless.clone())
    geo = analysis.geometry
    merged = None
    for per_sequence, ids in all_gather_objects((geo.per_sequence, geo.window_ids)):
        if ids.numel() == 0:
            continue
        part = GeometryResult(geo.n, per_sequence, ids, dict(geo.settings))
        merged = part if merged is None else merged.merge(part)
    merged.settings["n_windows"] = int(merged.window_ids.numel())
    merged.settings["world_size"] = size
    return Analysis(merged, HeadTaxonomy(votes, offsets, dict(analysis.taxonomy.settings, world_size=size), sinkless))

