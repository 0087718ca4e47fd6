"""Two analyses side by side: two corpora, two dtypes, base and fine-tuned, clean and patched.

``tlg.compare(a, b)`` returns a :class:`Comparison`. When both analyses cover the same grid of
heads (the same architecture), heads are compared one by one: label agreement and Cohen's κ,
the regime transition matrix, and per-head differences (``b − a``) of the F_N gap, the sink norm
ratio and the vote shares. Analyses of different architectures can only be compared at the
model level (regime fractions, F_N curves), and the comparison says so.

Example:
    >>> c = tlg.compare(tlg.analyze(model, code), tlg.analyze(model, news), names=("code", "news"))  # doctest: +SKIP
    >>> round(c.kappa, 3), c.transition_table()                                                      # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..errors import TLGeometryError
from ..heads import head_columns
from ..label.taxonomy import REGIMES
from ..measure.votes import VOTES
from .results import Analysis

__all__ = ["Comparison", "compare", "differing_settings"]


@dataclass
class Comparison:
    """What :func:`compare` measured.

    Attributes:
        names: how the two analyses are called in tables and plots.
        a, b: the analyses.
        head_by_head: whether the two cover the same ``[n_layers, n_heads]`` grid (then the
            per-head fields are set; otherwise they are None).
        note: one sentence on what could be compared.
        agreement, kappa: share of heads with the same label, Cohen's κ.
        transitions: ``[3, 3]`` counts, rows the regime in ``a``, columns in ``b``.
        deltas: per head, ``b − a``: ``gap`` ``[layer, head, n]`` (for the N both measured),
            ``norm_ratio`` and ``share_current`` / ``share_sink`` / ``share_other`` ``[layer, head]``.
        n: the N values both analyses measured (the last axis of ``deltas["gap"]``).
    """

    names: tuple[str, str]
    a: Analysis
    b: Analysis
    head_by_head: bool
    note: str
    n: tuple[int, ...]
    agreement: float | None = None
    kappa: float | None = None
    transitions: Int[Tensor, "3 3"] | None = None
    deltas: dict[str, Float[Tensor, "layer head ..."]] | None = None

    def __repr__(self) -> str:
        a, b = self.names
        same = (f"agreement {self.agreement:.1%}, κ={self.kappa:.2f}" if self.head_by_head and self.agreement is not None
                else self.note)
        return f"Comparison({a!r} vs {b!r}, N={list(self.n)}: {same})"

    def fractions(self):
        """Regime shares of the whole model, side by side: a DataFrame indexed by regime."""
        import pandas as pd

        columns = {name: analysis.taxonomy.fractions().iloc[-1][list(REGIMES)].astype(float)
                   for name, analysis in zip(self.names, (self.a, self.b), strict=True)}
        return pd.DataFrame(columns)

    def curves(self):
        """Model-level F_N of top-N and random sets and their gap per N, for both analyses."""
        import pandas as pd

        frames = []
        for name, analysis in zip(self.names, (self.a, self.b), strict=True):
            summary = analysis.geometry.summary()[["n", "f_top", "f_random", "gap"]]
            frames.append(summary.assign(analysis=name))
        return pd.concat(frames, ignore_index=True)

    def transition_table(self, shares: bool = False):
        """The regime transition matrix as a DataFrame (rows ``a``, columns ``b``); ``shares``:
        each row divided by its total (NaN for a regime ``a`` never assigned)."""
        import pandas as pd

        self._need_heads("the transition matrix")
        table = self.transitions.double()
        if shares:
            table = table / table.sum(1, keepdim=True)
        a, b = self.names
        return pd.DataFrame(table.numpy(), index=pd.Index([f"{a}: {r}" for r in REGIMES]),
                            columns=[f"{b}: {r}" for r in REGIMES])

    def to_dataframe(self):
        """One row per head: both labels, whether it changed, both values and the difference
        (``b − a``) of the gap at every shared N, the norm ratio and the vote shares."""
        import pandas as pd

        self._need_heads("a per-head table")
        a, b = self.names
        layers, heads = self.a.taxonomy.shape
        table: dict[str, Any] = {**head_columns(layers, heads),
                                 f"regime_{a}": self.a.taxonomy.labels.reshape(-1),
                                 f"regime_{b}": self.b.taxonomy.labels.reshape(-1)}
        table["changed"] = table[f"regime_{a}"] != table[f"regime_{b}"]
        for key, delta in self.deltas.items():
            flat = delta.reshape(layers * heads, -1).double()
            suffixes = [f"@{n}" for n in self.n] if key == "gap" else [""]
            for column, suffix in enumerate(suffixes):
                table[f"delta_{key}{suffix}"] = flat[:, column].numpy()
        return pd.DataFrame(table)

    def changed_heads(self, top: int = 10):
        """The heads that changed most: those whose label changed first, then by the largest
        ``|Δ gap|`` at the first shared N > 1 (a DataFrame of at most ``top`` rows)."""
        frame = self.to_dataframe()
        n = next((x for x in self.n if x > 1), self.n[0] if self.n else None)
        size = frame[f"delta_gap@{n}"].abs().fillna(0) if n is not None else 0.0  # no N in common: labels only
        return frame.assign(size=size).sort_values(["changed", "size"], ascending=False).drop(columns="size").head(top)

    def summary_lines(self) -> list[str]:
        """What the terminal prints: agreement and κ with 3 decimals, or why there are none."""
        a, b = self.names
        if not self.head_by_head:
            return [self.note]
        changed = int(self.transitions.sum() - self.transitions.diagonal().sum())
        return [f"{a} vs {b}: label agreement {self.agreement:.3f}, Cohen's kappa {self.kappa:.3f} "
                f"({changed} of {int(self.transitions.sum())} heads changed regime)", self.note]

    def _need_heads(self, what: str) -> None:
        if not self.head_by_head:
            raise TLGeometryError(f"{what} needs the same grid of heads in both analyses; {self.note}")


# Settings a reader needs to know differ between the two analyses (the comparison's very purpose,
# e.g. two dtypes, or something to keep in mind, e.g. two window lengths).
_SETTINGS = ("dtype", "corpus", "seq_len", "n_windows", "queries", "random_repeats", "seed",
             "transformer_lens")


def differing_settings(a: Analysis, b: Analysis) -> list[str]:
    """The settings in which the two analyses differ, as ``"seq_len 256 vs 1024"``."""
    ours, theirs = a.geometry.settings, b.geometry.settings
    return [f"{key} {ours.get(key, '?')} vs {theirs.get(key, '?')}" for key in _SETTINGS
            if key in ours and key in theirs and ours[key] != theirs[key]]


def compare(a: Analysis, b: Analysis, *, names: tuple[str, str] = ("a", "b")) -> Comparison:
    """Compare two analyses (see :class:`Comparison`); ``names`` label them in every table."""
    if not (isinstance(a, Analysis) and isinstance(b, Analysis)):
        raise TLGeometryError("compare takes two tlg.Analysis results (tlg.analyze or Analysis.load).")
    names = (str(names[0]), str(names[1]))
    if names[0] == names[1]:
        raise TLGeometryError(f"give the two analyses different names; both are {names[0]!r}.")
    shared = tuple(n for n in a.geometry.n if n in b.geometry.n)
    models = [analysis.geometry.settings.get("model", "?") for analysis in (a, b)]
    differences = differing_settings(a, b)
    differ = f" Settings that differ: {', '.join(differences)}." if differences else " Same settings."
    if a.taxonomy.shape != b.taxonomy.shape:
        note = (f"different architectures ({models[0]}: {a.taxonomy.shape[0]}×{a.taxonomy.shape[1]} heads, "
                f"{models[1]}: {b.taxonomy.shape[0]}×{b.taxonomy.shape[1]}): compared at the model level only "
                "(regime fractions, F_N curves); no head-by-head agreement." + differ)
        return Comparison(names, a, b, False, note, shared)
    same = "the same model" if models[0] == models[1] else f"{models[0]} and {models[1]} (same grid of heads)"
    note = f"{same}: compared head by head over {a.taxonomy.shape[0]}×{a.taxonomy.shape[1]} heads." + differ
    stats = a.taxonomy.agreement(b.taxonomy)
    ids_a, ids_b = a.taxonomy.label_ids.flatten(), b.taxonomy.label_ids.flatten()
    transitions = torch.zeros(len(REGIMES), len(REGIMES), dtype=torch.long)
    transitions.index_put_((ids_a, ids_b), torch.ones_like(ids_a), accumulate=True)
    deltas: dict[str, Tensor] = {}
    if shared:
        index_a = torch.tensor([a.geometry.n.index(n) for n in shared])
        index_b = torch.tensor([b.geometry.n.index(n) for n in shared])
        deltas["gap"] = b.geometry.mean("gap")[..., index_b] - a.geometry.mean("gap")[..., index_a]
    if a.geometry.has_sink and b.geometry.has_sink:
        deltas["norm_ratio"] = b.geometry.mean("norm_ratio") - a.geometry.mean("norm_ratio")
    for i, vote in enumerate(VOTES):
        deltas[f"share_{vote}"] = b.taxonomy.shares[..., i] - a.taxonomy.shares[..., i]
    return Comparison(names, a, b, True, note, shared, stats["agreement"], stats["kappa"], transitions, deltas)
