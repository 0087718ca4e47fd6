"""Model-level separability: stream a model over windows, aggregate per layer and head.

Averaging order (docs/metrics.md#random-baseline): random repeats within a query → queries within a sequence →
sequences. Every result keeps its per-sequence values (``[sequence, layer, head, n]``), so
results from shards merge into exactly the result of one run, and bootstrap intervals over
sequences are recomputed from them.

Example:
    >>> res = tlg.analyze(model, tokens, n=(1, 2, 4, 8)).geometry       # doctest: +SKIP
    >>> res.mean("gap").shape                                        # doctest: +SKIP
    torch.Size([30, 9, 4])
    >>> res.to_dataframe().head()                                    # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..capture.adapters import LayerAttention
from ..config import RunConfig
from ..errors import TLGeometryError
from ..io import load_tensors, save_tensors
from ..measure.layer_measures import LayerMeasures, RandomDraws

__all__ = ["GeometryResult", "window_key", "sequence_means", "bootstrap_ci"]

METRICS = ("precision", "recall", "f")
SOURCES = ("top", "random")
# Per-sequence sink and regime values without an N axis ([seq, layer, head]) and by key position.
SINK_HEAD_METRICS = (
    "norm_ratio", "sink_norm", "mean_norm", "sink_cosine", "sink_mass", "sink_rank",
    "c", "c_spread", "c0", "coherence_max", "coherence_mean", "sink_alignment", "sign_consistency", "regime_holds",
)
SINK_N_METRICS = (
    "f_nosink", "f_sink_selected", "f_sink_unselected", "sink_selected", "align_sink", "align_current",
    "precision_bound", "recall_bound", "precision_certificate", "recall_certificate",
)
LAG_METRICS = ("cosine_by_lag",)


def window_key(seed: int, window: int, layer: int) -> int:
    """64-bit key of the random rankings of one (run seed, window id, layer): results do not
    depend on batching or on how windows are sharded across processes. Returned as a signed
    int64 holding the key's bits (what a LongTensor stores)."""
    digest = hashlib.sha256(f"tl_geometry:{seed}:{window}:{layer}".encode()).digest()
    return int.from_bytes(digest[:8], "little", signed=True)


def sequence_means(values: Float[Tensor, "batch head query n"]) -> Float[Tensor, "batch head n"]:
    """Mean over the defined (non-NaN) queries of each sequence; NaN where none is defined."""
    return values.nanmean(2)


def bootstrap_ci(
    per_sequence: Float[Tensor, "seq ..."], replicates: int = 2000, seed: int = 0, level: float = 0.95
) -> Float[Tensor, "... 2"]:
    """Percentile bootstrap over sequences of the NaN-aware mean; ``[..., (low, high)]``.

    Resampling is expressed as multinomial count weights ``W [replicate, seq]``, so every
    replicate is one matrix product instead of a gather of the whole array.
    """
    n_seq = per_sequence.shape[0]
    flat = per_sequence.reshape(n_seq, -1).double()
    valid = ~torch.isnan(flat)
    gen = torch.Generator().manual_seed(seed)
    counts = torch.multinomial(torch.full((n_seq,), 1.0 / n_seq), n_seq * replicates, replacement=True, generator=gen)
    weights = torch.zeros(replicates, n_seq, dtype=torch.float64)
    weights.scatter_add_(1, counts.view(replicates, n_seq), torch.ones(replicates, n_seq, dtype=torch.float64))
    sums = weights @ flat.nan_to_num(0.0)
    numbers = weights @ valid.double()
    means = sums / numbers  # NaN where a replicate drew no defined value
    alpha = (1 - level) / 2
    bounds = torch.nanquantile(means, torch.tensor([alpha, 1 - alpha], dtype=torch.float64), dim=0)
    return bounds.T.reshape(*per_sequence.shape[1:], 2).to(per_sequence.dtype)


@dataclass
class GeometryResult:
    """Separability of a model per layer and head.

    Attributes:
        n: the N values (last axis of every tensor).
        per_sequence: ``{"f_top": [seq, layer, head, n], "precision_random": ..., ...}`` — the
            mean over each sequence's defined queries (NaN if none), for P/R/F of top-N and random.
        window_ids: ``[seq]`` window index of each sequence (sorted; merging keeps it sorted).
        settings: how the run was made (model, queries, distance, ranking, repeats, seed, versions).
    """

    n: tuple[int, ...]
    per_sequence: dict[str, Float[Tensor, "seq layer head n"]]
    window_ids: Int[Tensor, " seq"]
    settings: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        settings = ", ".join(f"{key}={self.settings[key]!r}" for key in ("model", "queries", "distance", "ranking")
                             if key in self.settings)
        bos = self.bos_line()
        windows = self.window_ids.numel()
        return (f"GeometryResult({windows} window{'s' if windows != 1 else ''}, {self.n_layers} layers × {self.n_heads} heads, "
                f"N={list(self.n)}, {len(self.per_sequence)} metrics{', ' + settings if settings else ''}"
                f"{', ' + bos if bos else ''})")

    @property
    def windows_without_bos(self) -> list[int] | None:
        """Ids of the windows that do not start with the model's BOS token (their position 0, taken
        as the sink, is a content token); None where that could not be known (a cache without its
        tokens, a tokenizer without BOS) or was not recorded."""
        bos = self.settings.get("bos")
        return list(bos["without"]) if isinstance(bos, dict) and bos.get("known") else None

    def bos_line(self) -> str:
        """Whether the windows start with BOS, in a few words ("" where not recorded)."""
        bos = self.settings.get("bos")
        if not isinstance(bos, dict):
            return ""
        without = self.windows_without_bos
        if without is None:
            return "BOS unknown"
        return "every window starts with BOS" if not without else \
            f"{len(without)} window{'s' if len(without) != 1 else ''} without BOS"

    @property
    def n_layers(self) -> int:
        return next(iter(self.per_sequence.values())).shape[1]

    @property
    def n_heads(self) -> int:
        return next(iter(self.per_sequence.values())).shape[2]

    def _values(self, metric: str) -> Tensor:
        if metric == "gap":
            return self.per_sequence["f_top"] - self.per_sequence["f_random"]
        if metric not in self.per_sequence:
            raise TLGeometryError(f"unknown metric {metric!r}; have {sorted(self.per_sequence)} and 'gap'.")
        return self.per_sequence[metric]

    def mean(self, metric: str = "f_top") -> Float[Tensor, "layer head ..."]:
        """Mean over sequences of a metric (``"f_top"``, ``"recall_random"``, ``"gap"``,
        ``"norm_ratio"``, …): ``[layer, head, n]``, or ``[layer, head]`` for per-head sink
        metrics, or ``[layer, head, pos]`` for ``cosine_by_lag``."""
        return self._values(metric).nanmean(0)

    @property
    def has_sink(self) -> bool:
        """Whether the run measured the sink diagnostics and the regime (``sink=True``)."""
        return "norm_ratio" in self.per_sequence

    def not_measurable(self) -> list[str]:
        """Why some of these results are NaN ("not measurable"), one sentence each (empty when
        every N was measurable and the random baseline ran)."""
        if "seq_len" not in self.settings:
            return []
        return RunConfig.from_dict(self.settings).not_measurable(int(self.settings["seq_len"]))

    def _bootstrap(self, per_sequence: Tensor, replicates: int | None = None) -> Tensor:
        """Bootstrap over the first axis with the run's replicate count and seed."""
        replicates = replicates or int(self.settings.get("bootstrap", 2000))
        return bootstrap_ci(per_sequence, replicates, seed=int(self.settings.get("seed", 0)))

    def ci(self, metric: str = "gap", replicates: int | None = None) -> Float[Tensor, "layer head *n 2"]:
        """95% bootstrap interval over sequences (seeded by the run seed)."""
        return self._bootstrap(self._values(metric), replicates)

    def summary(self):
        """Model-wide F_N per N (heads and layers averaged within each sequence, then sequences),
        top-N vs random and their gap, with 95% bootstrap intervals. A pandas DataFrame."""
        import pandas as pd

        rows = {}
        for metric in ("f_top", "f_random", "gap"):
            per_seq = self._values(metric).nanmean((1, 2))  # [seq, n]
            bounds = self._bootstrap(per_seq)
            rows[metric] = per_seq.nanmean(0)
            rows[f"{metric}_low"], rows[f"{metric}_high"] = bounds[:, 0], bounds[:, 1]
        frame = pd.DataFrame({k: v.double().numpy() for k, v in rows.items()})
        frame.insert(0, "n", list(self.n))
        return frame

    def merge(self, other: GeometryResult) -> GeometryResult:
        """Combine results over disjoint windows (any split, any order) into one."""
        if self.n != other.n or self.per_sequence.keys() != other.per_sequence.keys():
            raise TLGeometryError("cannot merge results computed with different N values or metrics.")
        ids = torch.cat([self.window_ids, other.window_ids])
        order = torch.argsort(ids, stable=True)
        if bool((ids[order][1:] == ids[order][:-1]).any()):
            raise TLGeometryError("the two results share windows; merge only disjoint shards.")
        merged = {k: torch.cat([self.per_sequence[k], other.per_sequence[k]])[order] for k in self.per_sequence}
        settings = dict(self.settings)
        if "n_windows" in settings:
            settings["n_windows"] = int(ids.numel())
        mine, theirs = self.settings.get("bos"), other.settings.get("bos")
        if isinstance(mine, dict) and isinstance(theirs, dict):
            settings["bos"] = {"known": bool(mine.get("known") and theirs.get("known")),
                               "without": sorted({*mine.get("without", []), *theirs.get("without", [])})}
        return GeometryResult(self.n, merged, ids[order], settings)

    def to_dataframe(self, with_ci: bool = False):
        """Long format: columns ``layer, head, name, metric, n, value`` (means over sequences;
        ``n`` is missing for per-head sink metrics)."""
        import pandas as pd

        layers, heads, ns = self.n_layers, self.n_heads, len(self.n)
        grid = torch.cartesian_prod(torch.arange(layers), torch.arange(heads), torch.arange(ns))
        head_grid = torch.cartesian_prod(torch.arange(layers), torch.arange(heads))
        frames = []
        for metric in [*self.per_sequence, "gap"]:
            if metric in LAG_METRICS:
                continue  # by position, not by N: see mean("cosine_by_lag")
            per_head = metric in SINK_HEAD_METRICS
            cells = head_grid if per_head else grid
            frame = pd.DataFrame({
                "layer": cells[:, 0].numpy(), "head": cells[:, 1].numpy(), "metric": metric,
                "n": pd.array([pd.NA] * len(cells), dtype="Int64") if per_head
                else torch.tensor(self.n)[cells[:, 2]].numpy(),
                "value": self.mean(metric).reshape(-1).double().numpy(),
            })
            if with_ci:
                bounds = self.ci(metric).reshape(-1, 2).double().numpy()
                frame["ci_low"], frame["ci_high"] = bounds[:, 0], bounds[:, 1]
            frames.append(frame)
        out = pd.concat(frames, ignore_index=True)
        out.insert(2, "name", "L" + out["layer"].astype(str) + "H" + out["head"].astype(str))
        return out

    def save(self, path: str | Path) -> None:
        """Write one safetensors file (tensors) with the settings as JSON metadata. No pickle."""
        save_tensors(path, "GeometryResult", {**self.per_sequence, "window_ids": self.window_ids},
                     n=list(self.n), settings=self.settings)

    @classmethod
    def load(cls, path: str | Path) -> GeometryResult:
        tensors, meta = load_tensors(path, "GeometryResult")
        ns, settings = meta.get("n"), meta.get("settings")
        if ("window_ids" not in tensors or not isinstance(ns, list) or not all(isinstance(x, int) for x in ns)
                or not isinstance(settings, dict)):
            raise TLGeometryError(f"cannot read {path} (its window_ids, n or settings are missing or malformed): "
                                  "rerun tl-geometry analyze")
        ids = tensors.pop("window_ids")
        return cls(tuple(ns), tensors, ids, settings)


class SeparabilityAccumulator:
    """Collects per-sequence means layer by layer during a streamed forward."""

    def __init__(self, n_layers: int, n_heads: int, config: RunConfig):
        self.n_layers, self.n_heads, self.config = n_layers, n_heads, config
        self.ns = config.n
        self.batches: list[dict[str, Tensor]] = []
        self.window_ids: list[Tensor] = []

    def start_batch(self, window_ids: Tensor, seq_len: int) -> None:
        batch = len(window_ids)
        self.window_ids.append(window_ids)
        shape = (batch, self.n_layers, self.n_heads)
        store = {f"{m}_{s}": torch.full((*shape, len(self.ns)), torch.nan) for s in SOURCES for m in METRICS}
        if self.config.sink:
            store.update({name: torch.full(shape, torch.nan) for name in SINK_HEAD_METRICS})
            store.update({name: torch.full((*shape, len(self.ns)), torch.nan) for name in SINK_N_METRICS})
            store["cosine_by_lag"] = torch.full((*shape, seq_len), torch.nan)
        self.batches.append(store)

    def random_draws(self, att: LayerAttention) -> RandomDraws | None:
        """The random rankings of one layer of this batch (None without a random baseline): one key
        per (window, layer), ``config.random_repeats`` rankings per query."""
        repeats = self.config.random_repeats(att.pattern.shape[-1])
        if repeats == 0:
            return None
        keys = torch.tensor([window_key(self.config.seed, int(w), att.layer) for w in self.window_ids[-1].tolist()],
                            dtype=torch.int64)
        return RandomDraws(keys, repeats)

    def add(self, layer: int, measures: LayerMeasures, heads_per_kv: int) -> None:
        """Per-sequence means of one layer's measures (per-kv values go to each query head reading them)."""
        store = self.batches[-1]

        def put(name: str, value: Tensor) -> None:
            store[name][:, layer] = value.float().cpu()

        for name, value in measures.per_query.items():
            if name in store:  # margins and inversion counts stay per query (certificates use them)
                put(name, sequence_means(value))
        for name, value in measures.per_row.items():
            put(name, value.nanmean(-1))
        for name, value in measures.per_kv.items():
            put(name, value.repeat_interleave(heads_per_kv, 1))
        if measures.cosine_by_lag is not None:
            put("cosine_by_lag", measures.cosine_by_lag.repeat_interleave(heads_per_kv, 1))

    def result(self, settings: dict[str, Any], allow_empty: bool = False) -> GeometryResult:
        if not self.batches:
            if not allow_empty:
                raise TLGeometryError("no sequences were analysed: pass at least one window of tokens.")
            self.start_batch(torch.zeros(0, dtype=torch.long), int(settings.get("seq_len", 0)))
        per_sequence = {k: torch.cat([b[k] for b in self.batches]) for k in self.batches[0]}
        ids = torch.cat(self.window_ids)
        order = torch.argsort(ids, stable=True)
        return GeometryResult(self.ns, {k: v[order] for k, v in per_sequence.items()}, ids[order], settings)
