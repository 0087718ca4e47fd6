"""Parameter-free head taxonomy (docs/metrics.md#taxonomy): Retriever / Mixer / Reset from winner-source votes.

A head's label is the plurality of its votes (:mod:`~tl_geometry.measure.votes`) over all analysed
queries and sequences: ``retriever`` (current), ``mixer`` (sink), and ``reset`` when ``other``
leads or the lead is tied. Vote shares are the confidence; the dominant offset of ``other``
votes tells a previous-token head (offset 1) from a diffuse one.

Example:
    >>> import torch
    >>> votes = torch.tensor([[[3, 0, 0], [1, 2, 2]]])   # [layer, head, (current, sink, other)]
    >>> HeadTaxonomy.from_votes(votes).labels.tolist()
    [['retriever', 'reset']]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ..errors import TLGeometryError
from ..heads import head_columns, head_name
from ..io import load_tensors, save_tensors
from ..measure.votes import VOTES

__all__ = ["REGIMES", "REGIME_MEANING", "REGIME_FAMILIAR", "regime_gloss", "HeadTaxonomy", "TaxonomyAccumulator"]

REGIMES = ("retriever", "mixer", "reset")  # the label of a plurality of VOTES[i] is REGIMES[i]
# What each label means, said beside it wherever a label is shown: the source whose contribution
# α·‖v‖ is the query's largest ("wins") is the current token, the sink, or another token.
REGIME_MEANING = {"retriever": "the current token wins", "mixer": "the sink wins", "reset": "another token wins"}
# The TransformerLens head types a label usually holds, as measured (docs/metrics.md, "Familiar
# head types"): a "retriever" is not a retrieval head, and a head resting on BOS is a mixer.
REGIME_FAMILIAR = {"mixer": "heads resting on BOS; induction heads, between their triggers",
                   "reset": "previous-token heads"}


def regime_gloss(regime: str, *, familiar: bool = False) -> str:
    """``"mixer: the sink wins"``; with ``familiar`` the TransformerLens head types it usually
    holds, where there are some: ``"mixer: the sink wins (heads resting on BOS)"``."""
    known = REGIME_FAMILIAR.get(regime) if familiar else None
    return f"{regime}: {REGIME_MEANING[regime]}" + (f" ({known})" if known else "")


def _wilson(successes: Tensor, total: Tensor, z: float = 1.959963984540054) -> tuple[Tensor, Tensor]:
    """Wilson score interval of ``successes / total`` (95% by default); NaN where ``total`` is 0."""
    n = total.double().where(total > 0, torch.nan)
    share = successes.double() / n
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * torch.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


@dataclass
class HeadTaxonomy:
    """Regime of every head of a model, from votes summed over sequences and queries.

    Attributes:
        votes: ``[n_layers, n_heads, 3]`` counts of (current, sink, other) votes.
        offsets: ``[n_layers, n_heads, max_offset]`` counts of ``t − w(t)`` among ``other`` votes.
        settings: how the votes were collected (model, corpus, queries, …).
        sinkless: ``[n_layers, n_heads]`` votes cast by rows whose sliding window had left the sink
            behind (they could vote only ``current`` or ``other``); None where not counted.
    """

    votes: Int[Tensor, "layer head 3"]
    offsets: Int[Tensor, "layer head offset"] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    sinkless: Int[Tensor, "layer head"] | None = None

    def __repr__(self) -> str:
        layers, heads = self.shape
        ids = self.label_ids
        shares = ", ".join(f"{regime} {float((ids == i).double().mean()):.1%}" for i, regime in enumerate(REGIMES))
        model = self.settings.get("model")
        counts = self.n_votes
        votes = f"{int(counts.min())}–{int(counts.max())}" if int(counts.min()) != int(counts.max()) else f"{int(counts.min())}"
        uncertain = int(self.label_uncertain.sum())
        meanings = "; ".join(regime_gloss(regime) for regime in REGIMES)
        return (f"HeadTaxonomy({layers} layers × {heads} heads{f' of {model}' if model else ''}: {shares} "
                f"({meanings}); {votes} votes per head from {self.basis}, {uncertain} "
                f"label{'s' if uncertain != 1 else ''} within the 95% interval of the runner-up)")

    @property
    def basis(self) -> str:
        """What the labels rest on, in words: ``"8 windows × 256 tokens of python-reference, last
        queries"`` (the parts the settings record). Labels move with the text: compare a task's
        labels with a corpus run's before joining them (docs/metrics.md#which-labels)."""
        settings = self.settings
        windows, length = settings.get("n_windows"), settings.get("seq_len")
        text = f"{windows} windows × {length} tokens" if windows and length else "the analysed windows"
        corpus = settings.get("corpus")
        queries = settings.get("queries")
        return text + (f" of {corpus}" if corpus else "") + (f", {queries} queries" if queries else "")

    def describe_head(self, layer: int, head: int) -> str:
        """A head's label in words: ``"L18H8, a mixer: the sink wins 97% of its 2,040 queries"``."""
        regime, votes = self.labels[layer, head], int(self.n_votes[layer, head])
        ordered = self.votes[layer, head].sort(descending=True).values
        if votes == 0:
            return f"{head_name(layer, head)}, a reset: no query voted"
        if int(ordered[0]) == int(ordered[1]):
            return f"{head_name(layer, head)}, a reset: no source wins most of its {votes:,} queries (a tie)"
        share = float(self.shares[layer, head, REGIMES.index(regime)])
        return f"{head_name(layer, head)}, a {regime}: {REGIME_MEANING[regime]} {share:.0%} of its {votes:,} queries"

    def clearest(self, k: int = 3, *, uncertain: bool = False) -> dict[str, list[tuple[int, int]]]:
        """Up to ``k`` heads of each regime, the surest first: ordered by the lower end of the
        Wilson 95% interval of their winning share; uncertain labels left out, or with
        ``uncertain=True`` after the sure ones (heads without votes never)."""
        low, _ = self.share_interval
        # an uncertain label scores in [-1, 0) (its order kept), a sure one in [0, 1], none -2
        sure = low.where(~self.label_uncertain, low - 1 if uncertain else torch.nan).nan_to_num(-2.0)
        chosen = {}
        for i, regime in enumerate(REGIMES):
            score = sure.where(self.label_ids == i, -2.0).flatten()
            order = [int(x) for x in score.argsort(descending=True, stable=True)[:k] if float(score[x]) >= -1]
            chosen[regime] = [divmod(x, self.shape[1]) for x in order]
        return chosen

    @classmethod
    def from_votes(cls, votes: Tensor, offsets: Tensor | None = None, settings: dict | None = None) -> HeadTaxonomy:
        return cls(votes.long(), None if offsets is None else offsets.long(), dict(settings or {}))

    @property
    def label_ids(self) -> Int[Tensor, "layer head"]:
        """0 = retriever, 1 = mixer, 2 = reset (plurality; ties and empty heads are reset)."""
        top = self.votes.amax(-1, keepdim=True)
        unique = (self.votes == top).sum(-1) == 1
        winner = self.votes.argmax(-1)
        return torch.where(unique & (top[..., 0] > 0), winner, 2)

    @property
    def labels(self) -> np.ndarray:
        """``[n_layers, n_heads]`` array of ``"retriever" | "mixer" | "reset"``."""
        return np.array(REGIMES, dtype=object)[self.label_ids.numpy()]

    @property
    def shares(self) -> Float[Tensor, "layer head 3"]:
        """Vote shares (current, sink, other); NaN for a head without votes."""
        total = self.votes.sum(-1, keepdim=True)
        return self.votes / total.where(total > 0, torch.nan)

    @property
    def n_votes(self) -> Int[Tensor, "layer head"]:
        """Votes behind each head's label: its voting rows over every window."""
        return self.votes.sum(-1)

    @property
    def share_interval(self) -> tuple[Float[Tensor, "layer head"], Float[Tensor, "layer head"]]:
        """Wilson 95% interval ``(low, high)`` of each head's winning vote share (the regime's); NaN
        without votes. docs/metrics.md#taxonomy."""
        return _wilson(self.votes.amax(-1), self.n_votes)

    @property
    def label_uncertain(self) -> Bool[Tensor, "layer head"]:
        """Whether the label could flip within the votes' sampling error: the winner's Wilson 95%
        interval reaches down to the runner-up's (ties and heads without votes included)."""
        ordered = self.votes.sort(-1, descending=True).values
        low, _ = _wilson(ordered[..., 0], self.n_votes)
        _, high = _wilson(ordered[..., 1], self.n_votes)
        return ~(low > high)

    @property
    def sinkless_share(self) -> Float[Tensor, "layer head"]:
        """Share of each head's votes cast by rows that could not see the sink (sliding windows):
        a ``mixer`` label rests on the other rows only. NaN without votes or counts."""
        total = self.votes.sum(-1).double()
        if self.sinkless is None:
            return torch.full(total.shape, torch.nan, dtype=torch.float64)
        return self.sinkless / total.where(total > 0, torch.nan)

    @property
    def dominant_offset(self) -> Int[Tensor, "layer head"]:
        """Most frequent ``t − w(t)`` among ``other`` votes (ties to the smaller offset); -1 without any."""
        if self.offsets is None:
            raise TLGeometryError("this taxonomy was built without offset counts.")
        any_other = self.offsets.sum(-1) > 0
        return torch.where(any_other, self.offsets.argmax(-1), -1)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.votes.shape[:2])

    def check_fits(self, n_layers: int, n_heads: int, fix: str) -> None:
        """Refuse a model whose grid of heads is not this taxonomy's (another model's votes would
        be read as this one's); ``fix`` ends the one-line error."""
        if tuple(self.shape) != (n_layers, n_heads):
            raise TLGeometryError(f"the taxonomy has {self.shape[0]}×{self.shape[1]} heads (model "
                                  f"{self.settings.get('model', '?')!r}) but this model has {n_layers}×{n_heads}: {fix}.")

    def heads(self, regime: str) -> list[tuple[int, int]]:
        """``(layer, head)`` of every head labelled ``regime``, in layer-major order."""
        if regime not in REGIMES:
            raise TLGeometryError(f"regime must be one of {REGIMES}; got {regime!r}.")
        return [tuple(x) for x in (self.label_ids == REGIMES.index(regime)).nonzero().tolist()]

    def fractions(self):
        """Regime shares per layer and for the whole model (``layer = "all"``): a DataFrame."""
        import pandas as pd

        ids = self.label_ids
        rows = [{"layer": layer, **{r: float((ids[layer] == i).double().mean()) for i, r in enumerate(REGIMES)}}
                for layer in range(ids.shape[0])]
        rows.append({"layer": "all", **{r: float((ids == i).double().mean()) for i, r in enumerate(REGIMES)}})
        return pd.DataFrame(rows)

    def to_dataframe(self):
        """Long format: ``layer, head, name, regime, metric, value`` with the vote counts, shares
        and (when known) the dominant offset."""
        import pandas as pd

        base = {**head_columns(*self.shape), "regime": self.labels.reshape(-1)}
        metrics = {f"votes_{k}": self.votes[..., i] for i, k in enumerate(VOTES)}
        metrics.update({f"share_{k}": self.shares[..., i] for i, k in enumerate(VOTES)})
        if self.offsets is not None:
            metrics["dominant_offset"] = self.dominant_offset
        if self.sinkless is not None:
            metrics["votes_sinkless"] = self.sinkless
        frames = [pd.DataFrame({**base, "metric": name, "value": value.reshape(-1).double().numpy()})
                  for name, value in metrics.items()]
        return pd.concat(frames, ignore_index=True)

    def agreement(self, other: HeadTaxonomy) -> dict[str, float]:
        """Fraction of equal labels and Cohen's kappa between two taxonomies of the same model."""
        if self.shape != other.shape:
            raise TLGeometryError(f"taxonomies of different models: {self.shape} vs {other.shape} heads.")
        a, b = self.label_ids.flatten(), other.label_ids.flatten()
        observed = float((a == b).float().mean())
        expected = sum(float((a == k).float().mean() * (b == k).float().mean()) for k in range(len(REGIMES)))
        kappa = 1.0 if expected == 1 else (observed - expected) / (1 - expected)
        return {"agreement": observed, "kappa": kappa}

    def merge(self, other: HeadTaxonomy) -> HeadTaxonomy:
        """Votes of two disjoint sets of windows (any split, any order): counts add."""
        if self.shape != other.shape:
            raise TLGeometryError("cannot merge taxonomies of different models.")
        offsets = None
        if self.offsets is not None and other.offsets is not None:
            width = max(self.offsets.shape[-1], other.offsets.shape[-1])
            offsets = torch.nn.functional.pad(self.offsets, (0, width - self.offsets.shape[-1])) + \
                torch.nn.functional.pad(other.offsets, (0, width - other.offsets.shape[-1]))
        sinkless = None if self.sinkless is None or other.sinkless is None else self.sinkless + other.sinkless
        return HeadTaxonomy(self.votes + other.votes, offsets, dict(self.settings), sinkless)

    def save(self, path: str | Path) -> None:
        """One safetensors file (counts) with the settings as JSON metadata."""
        tensors = {"votes": self.votes, "offsets": self.offsets, "sinkless_votes": self.sinkless}
        save_tensors(path, "HeadTaxonomy", {k: v for k, v in tensors.items() if v is not None}, settings=self.settings)

    @classmethod
    def load(cls, path: str | Path) -> HeadTaxonomy:
        tensors, meta = load_tensors(path, "HeadTaxonomy")
        votes, settings = tensors.get("votes"), meta.get("settings")
        if votes is None or votes.ndim != 3 or votes.shape[-1] != 3 or not isinstance(settings, dict):
            raise TLGeometryError(f"cannot read {path} (its votes or settings are missing or malformed): rerun "
                                  "tl-geometry analyze")
        return cls(votes, tensors.get("offsets"), settings, tensors.get("sinkless_votes"))


class TaxonomyAccumulator:
    """Votes and offset counts of every layer during a streamed forward (counts add over batches)."""

    def __init__(self, n_layers: int, n_heads: int, n_pos: int):
        self.votes = torch.zeros(n_layers, n_heads, 3, dtype=torch.long)
        self.offsets = torch.zeros(n_layers, n_heads, n_pos, dtype=torch.long)
        self.sinkless = torch.zeros(n_layers, n_heads, dtype=torch.long)

    def add_votes(self, layer: int, votes: Int[Tensor, "batch head 3"], offsets: Int[Tensor, "batch head key"],
                  sinkless: Int[Tensor, " batch"] | None = None) -> None:
        """Votes and offset counts of one layer's windows (``measure_layer``'s), and the votes each
        window's rows cast without a visible sink (every head of a layer votes on the same rows)."""
        self.votes[layer] += votes.sum(0).cpu()
        self.offsets[layer] += offsets.sum(0).cpu()
        if sinkless is not None:
            self.sinkless[layer] += int(sinkless.sum())

    def result(self, settings: dict[str, Any]) -> HeadTaxonomy:
        return HeadTaxonomy(self.votes.clone(), self.offsets.clone(), dict(settings), self.sinkless.clone())
