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
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from ..capture.adapters import stream_layers, unexplained_window
from ..capture.cache import read_layer
from ..capture.model_info import checkpoint_key
from ..config import Distance, Queries, Ranking, RunConfig
from ..errors import TLGeometryError
from ..io import token_digest
from ..label.head_types import auto_length
from ..label.head_types import head_types as measure_head_types
from ..label.taxonomy import HeadTaxonomy, TaxonomyAccumulator
from ..measure.layer_measures import Workspace, measure_layer
from ..measure.query_rows import as_n_tuple
from .checkpoint import KeyedCheckpoint
from .distributed import all_gather_objects, all_reduce, my_shard, world
from .geometry import GeometryResult, SeparabilityAccumulator
from .inputs import Windows, differs, read_windows, warn_not_measurable
from .results import Analysis

__all__ = ["analyze", "gather_analysis"]

# Below this many votes a head's Wilson 95% interval is wider than ±0.1 around an even share.
FEW_VOTES = 100


def _stream_windows(model, windows: Windows, batch_size, progress, on_layer, on_batch=None,
                    after_batch=None, first: int = 0) -> None:
    """Stream the model over the windows ``first..`` batch by batch (tqdm bar per batch)."""
    from tqdm.auto import tqdm

    from .._engine import kernels_cached

    tokens, attention_mask = windows.tokens, windows.attention_mask
    starts = range(first, tokens.shape[0], batch_size)
    desc = "windows" if kernels_cached() else "windows (compiling kernels, once per installation: about a minute)"
    bar = tqdm(starts, desc=desc, unit="batch", disable=not progress, initial=0)
    for start in bar:
        rows = slice(start, start + batch_size)
        if on_batch is not None:
            on_batch(rows)
        mask = None if attention_mask is None else attention_mask[rows]
        stream_layers(model, tokens[rows], on_layer, attention_mask=mask, info=windows.info)
        bar.set_description("windows", refresh=False)
        if after_batch is not None:
            after_batch()


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
            ``model.run_with_cache(tokens, names_filter=tlg.capture.names_filter)`` (or a dict keyed by hook
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
            (:func:`~tl_geometry.label.head_types.head_types`: one more forward, of BOS + 2 × 50 random
            tokens); ``False`` skips it. A cache cannot run that forward: attach them with
            ``res.with_head_types(tlg.head_types(model))``, as ``print(res)`` says.

    Returns:
        :class:`Analysis` with ``geometry`` (``[seq, layer, head, n]`` per-sequence values) and
        ``taxonomy`` (labels ``[layer, head]``).
    """
    keywords = dict(n=n, queries=queries, taxonomy_queries=taxonomy_queries, distance=distance, ranking=ranking,
                    exclude_sink=exclude_sink, repeats=repeats, seed=seed, bootstrap=bootstrap, sink=sink)
    config = _one_config(config, keywords)
    windows = read_windows(model, tokens_or_texts, attention_mask, window_ids, checkpoint=checkpoint,
                           batch_size=batch_size, allow_hooks=allow_hooks)
    cache = windows.cache
    warn_not_measurable(config, windows.tokens, windows.attention_mask)
    all_windows = int(windows.tokens.shape[0])
    shard = my_shard(all_windows, checkpoint) if cache is None and distributed is not False else None
    if shard is not None:  # this rank's windows; merged at the end
        rows, checkpoint = shard
        windows = windows.select(rows)
    settings = _settings(config, windows.info, windows.tokens, all_windows, windows.bos)
    layer_pass = _LayerPass(windows.info, config, windows.tokens.shape[1], windows.window_ids)
    if cache is not None:
        layer_pass.read_cache(cache, windows.tokens if windows.tokens_given else None, windows.attention_mask,
                              progress)
    else:
        resumed = None if checkpoint is None else Checkpoint(checkpoint, {**settings, **checkpoint_key(model)}, layer_pass,
                                                             batch_size, windows)
        _stream_windows(model, windows, batch_size, progress and world()[0] == 0, layer_pass.on_layer,
                        layer_pass.on_batch, None if resumed is None else resumed.save,
                        first=0 if resumed is None else resumed.done)
    result = layer_pass.result(settings, sharded=shard is not None)
    result = gather_analysis(result) if shard is not None else result
    if cache is None and head_types and auto_length(model) >= 2:  # the hooks were warned about above
        result = result.with_head_types(measure_head_types(model, allow_hooks=True))
    _warn_few_votes(result.taxonomy)
    return result


def _one_config(config: RunConfig | None, keywords: dict[str, Any]) -> RunConfig:
    """The run's settings from ``config`` or from the keywords, refused when both are given (a
    keyword beside ``config=`` would otherwise be dropped without a word)."""
    if config is None:
        return RunConfig(**dict(keywords, n=as_n_tuple(keywords["n"])))
    defaults = inspect.signature(analyze).parameters
    given = [name for name, value in keywords.items() if differs(value, defaults[name].default)]
    if given:
        raise TLGeometryError(f"pass the settings as config= or as keywords, not both: config= was given with "
                              f"{', '.join(given)}; use dataclasses.replace(config, ...) to change it.")
    return config


def _settings(config: RunConfig, info: Any, tokens: Tensor, all_windows: int, bos: dict[str, Any]) -> dict[str, Any]:
    """The settings every result of the run records (and its checkpoint is keyed by)."""
    return {
        **config.to_dict(), "random_repeats": config.random_repeats(int(tokens.shape[1])),
        "model": info.model_name, "model_class": info.model_class, "dtype": info.dtype,
        "transformer_lens": info.transformer_lens_version, "processing": info.processing,
        "n_windows": all_windows, "seq_len": int(tokens.shape[1]), "bos": bos, "n_kv_heads": info.n_kv_heads,
        "sliding_windows": {str(layer): window for layer, window in sorted(info.sliding_windows.items())},
    }


class _LayerPass:
    """Every layer's measurement added to the run's accumulators, as the forward (or the cache) gives it."""

    def __init__(self, info: Any, config: RunConfig, seq_len: int, window_ids: Tensor):
        self.info, self.config, self.seq_len, self.window_ids = info, config, seq_len, window_ids
        self.geometry = SeparabilityAccumulator(info.n_layers, info.n_heads, config)
        self.taxonomy = TaxonomyAccumulator(info.n_layers, info.n_heads, seq_len)
        self.workspace = Workspace()
        self.unexplained: set[int] = set()  # layers already warned about

    def on_layer(self, layer: int, att: Any) -> None:
        if layer not in self.unexplained:
            _warn_unexplained_window(layer, att, self.unexplained)
        measures = measure_layer(att, self.config, self.geometry.random_draws(att), workspace=self.workspace)
        self.geometry.add(layer, measures, att.heads_per_kv)
        self.taxonomy.add_votes(layer, measures.votes, measures.offsets, measures.sinkless_votes)

    def on_batch(self, rows: slice) -> None:
        self.geometry.start_batch(self.window_ids[rows], self.seq_len)

    def read_cache(self, cache: Any, tokens: Tensor | None, attention_mask: Tensor | None, progress: bool) -> None:
        """Every layer of a cache, in one batch (``tokens``: where given, to read BOS and pads)."""
        from tqdm.auto import tqdm

        self.on_batch(slice(0, len(self.window_ids)))
        for layer in tqdm(range(self.info.n_layers), desc="layers", disable=not progress):
            self.on_layer(layer, read_layer(cache, layer, attention_mask=attention_mask, tokens=tokens,
                                            bos_token_id=self.info.bos_token_id, window=self.info.window(layer)))

    def result(self, settings: dict[str, Any], *, sharded: bool) -> Analysis:
        return Analysis(self.geometry.result(settings, allow_empty=sharded), self.taxonomy.result(settings))


class Checkpoint:
    """The state of a streamed analysis (a :class:`~tl_geometry.run.checkpoint.KeyedCheckpoint` keyed
    by the run's settings, batch size, tokens and window ids): the per-sequence values and votes of
    the batches done so far, restored into ``layer_pass`` on opening (:attr:`done` windows) and saved
    after every batch. A run killed at any moment loses at most the batch in flight; a checkpoint of
    other settings is refused before the first batch."""

    def __init__(self, path, settings, layer_pass: _LayerPass, batch_size: int, windows: Windows):
        self.geometry, self.taxonomy = layer_pass.geometry, layer_pass.taxonomy
        self.file = KeyedCheckpoint(path, {**settings, "batch_size": batch_size,
                                           "tokens": token_digest(windows.tokens, windows.attention_mask),
                                           "window_ids": windows.window_ids.tolist()}, "analysis")
        self.done = self._restore()
        if self.done % batch_size and self.done < windows.tokens.shape[0]:
            raise TLGeometryError(f"checkpoint {str(path)!r} holds {self.done} windows, not a whole number of batches.")

    def _restore(self) -> int:
        """Load the saved state into the accumulators; returns the number of windows done."""
        tensors, _ = self.file.load()
        if not tensors:
            return 0
        ids = tensors.pop("window_ids")
        self.taxonomy.votes, self.taxonomy.offsets = tensors.pop("votes"), tensors.pop("offsets")
        self.taxonomy.sinkless = tensors.pop("sinkless_votes", torch.zeros_like(self.taxonomy.votes[..., 0]))
        self.geometry.batches, self.geometry.window_ids = [tensors], [ids]
        return int(ids.numel())

    def save(self) -> None:
        tensors = {k: torch.cat([b[k] for b in self.geometry.batches]) for k in self.geometry.batches[0]}
        tensors.update(window_ids=torch.cat(self.geometry.window_ids), votes=self.taxonomy.votes,
                       offsets=self.taxonomy.offsets, sinkless_votes=self.taxonomy.sinkless)
        self.file.save(tensors)


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

