"""Streaming heads (docs/metrics.md#streaming): which kv heads can keep only the sink and a recent window.

A kv head saves memory at inference only when every query head that reads it attends to the
first ``sink`` positions and the last ``window`` positions alone (StreamingLLM-style attention, the
``"window"`` ablation mode). :func:`streaming_curve` streams a growing fraction of the kv heads in
the order of each rule and measures the relative ΔNLL, against an oracle that streams each kv head
alone first:

- ``"taxonomy"``: the analysis' votes: the share of a head's query rows whose winning source
  (``argmax α_j‖v_j‖``) lies ``window`` or more positions back, the largest over the kv head's
  query heads; least first.
- ``"echo_induction"``: RazorAttention's data-free rule on repeated random tokens: the
  duplicate-token (echo) plus the induction score of :func:`~tl_geometry.label.head_types`; least first.
- ``"entropy"``: the mean attention entropy over the windows; the sharpest heads first.
- ``"random"``: seeded permutations (mean and spread over seeds).
- ``"oracle"``: ΔNLL of streaming each kv head alone; cheapest first (one evaluation per kv head).

Example:
    >>> res = tlg.analyze(model, windows)                                           # doctest: +SKIP
    >>> curve = tlg.intervene.streaming_curve(model, long_windows, res, window=64, sink=4)    # doctest: +SKIP
    >>> curve.to_dataframe()                                                        # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..capture.model_info import ModelInfo, checkpoint_key, describe_model
from ..config import STREAMING_ORDERS, StreamingOrder
from ..errors import TLGeometryError
from ..io import token_digest
from ..label.head_types import HeadTypes, head_types
from ..label.taxonomy import HeadTaxonomy
from ..run.checkpoint import KeyedCheckpoint
from .ablation import ablate_heads, check_window
from .importance import head_importance
from .residual_replay import ReplayedForwards

__all__ = ["StreamingOrder", "STREAMING_ORDERS", "StreamingCurve", "streaming_curve", "check_streaming_arguments",
           "kv_head_needs", "stream_checkpoint"]

DEFAULT_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def kv_head_needs(per_head: Float[Tensor, "layer head"], n_kv_heads: int) -> Float[Tensor, "layer kv"]:
    """A kv head needs the whole context as much as the neediest query head that reads it
    (query head ``h`` reads kv head ``h // (n_heads / n_kv_heads)``)."""
    layers, heads = per_head.shape
    return per_head.reshape(layers, n_kv_heads, heads // n_kv_heads).amax(-1)


def taxonomy_need(taxonomy: HeadTaxonomy, window: int) -> Float[Tensor, "layer head"]:
    """The share of a head's votes whose winner lies ``window`` or more positions before its query
    (``t − w ≥ window``; the offsets of the "other" votes), of all its votes."""
    if taxonomy.offsets is None:
        raise TLGeometryError("this taxonomy has no winner offsets (saved before they were kept): rerun the analysis.")
    total = taxonomy.votes.sum(-1).double()
    far = taxonomy.offsets[..., window:].sum(-1).double()
    return torch.where(total > 0, far / total.clamp_min(1), 0.0)


@dataclass
class StreamingCurve:
    """ΔNLL (relative, as the pruning curves) when a fraction of kv heads stream, per order.

    Attributes:
        fractions: the streamed fractions of all kv heads.
        delta_nll: per order ``[len(fractions)]`` (``"random"``: ``[seeds, len(fractions)]``).
        orders: per order the kv heads in streaming order, flat ``layer · n_kv + kv`` (``"random"``:
            ``[seeds, n]``).
        needs: per rule ``[n_layers, n_kv]`` the score it orders by (least streamed first).
        baseline_nll: NLL (nats per token) without streaming.
        settings: window, sink, windows and their length, the model.
    """

    fractions: tuple[float, ...]
    delta_nll: dict[str, Tensor]
    orders: dict[str, Tensor]
    needs: dict[str, Tensor]
    baseline_nll: float
    settings: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        area = ", ".join(f"{name} {value:+.4f}" for name, value in self.area_to_oracle().items())
        return (f"StreamingCurve(window {self.settings.get('window')}, sink {self.settings.get('sink')}, "
                f"{len(self.fractions)} fractions; area above the oracle: {area})")

    def mean_curve(self, order: StreamingOrder) -> Tensor:
        """The order's ΔNLL per fraction (the mean over seeds for ``"random"``)."""
        curve = self.delta_nll[order]
        return curve.mean(0) if curve.dim() == 2 else curve

    def area_to_oracle(self) -> dict[str, float]:
        """Per order, the area between its (mean) curve and the oracle's over the fractions
        (trapezoids; 0 for the oracle itself), when the oracle was measured."""
        if "oracle" not in self.delta_nll:
            return {}
        x = torch.tensor(self.fractions, dtype=torch.float64)
        oracle = self.mean_curve("oracle").double()
        return {name: float(torch.trapezoid(self.mean_curve(name).double() - oracle, x)) for name in self.delta_nll}

    def to_dataframe(self):
        """Long format: ``order, seed, fraction, kv_heads_streamed, delta_nll`` (seed 0 except for
        the random order), with the run's ``window, sink, seq_len, n_kv_total, baseline_nll``."""
        import pandas as pd

        n_kv = self.settings["n_kv_total"]
        rows = []
        for name, curve in self.delta_nll.items():
            curves = curve if curve.dim() == 2 else curve[None]
            for seed, values in enumerate(curves.tolist()):
                for fraction, value in zip(self.fractions, values, strict=True):
                    rows.append({"order": name, "seed": seed, "fraction": fraction,
                                 "kv_heads_streamed": _count(fraction, n_kv), "delta_nll": value})
        frame = pd.DataFrame(rows)
        for key in ("window", "sink", "seq_len", "n_kv_total"):
            frame[key] = self.settings[key]
        frame["baseline_nll"] = self.baseline_nll
        return frame

    @classmethod
    def from_dataframe(cls, frame) -> StreamingCurve:
        """The curves of a :meth:`to_dataframe` table (the orders and needs are not in it)."""
        fractions = tuple(sorted(float(f) for f in frame["fraction"].unique()))
        delta = {}
        for name, part in frame.groupby("order", sort=False):
            table = part.pivot_table(index="seed", columns="fraction", values="delta_nll").reindex(columns=fractions)
            values = torch.tensor(table.to_numpy(), dtype=torch.float64)
            delta[str(name)] = values if name == "random" else values[0]
        first = frame.iloc[0]
        settings = {key: int(first[key]) for key in ("window", "sink", "seq_len", "n_kv_total")}
        return cls(fractions, delta, {}, {}, float(first["baseline_nll"]), settings)


def _count(fraction: float, n_kv: int) -> int:
    return round(fraction * n_kv)


def check_streaming_arguments(seq_len: int, fractions, orders, window, sink, seeds) -> None:
    """Refuse what :func:`streaming_curve` cannot measure, in one line each (before any model work)."""
    check_window(window, sink, seq_len)
    unknown = [name for name in orders if name not in STREAMING_ORDERS]
    if unknown or not orders:
        raise TLGeometryError(f"unknown streaming order {unknown[0] if unknown else 'none'!r}: use some of "
                              f"{', '.join(STREAMING_ORDERS)}.")
    if not fractions or any(isinstance(f, bool) or not isinstance(f, int | float) or not 0 < f <= 1 for f in fractions):
        raise TLGeometryError(f"fractions must lie in (0, 1] (the share of kv heads that stream); got {list(fractions)}.")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise TLGeometryError(f"seeds must be an int ≥ 1 (random orders); got {seeds!r}.")


def stream_checkpoint(path: str | Path, model: Any, tokens: Tensor, attention_mask: Tensor | None = None, *,
                      window: int = 64, sink: int = 4) -> KeyedCheckpoint:
    """The checkpoint of :func:`streaming_curve` at ``path`` for these model, windows, window and
    sink (the evaluations do not depend on the orders, fractions or seeds asked for)."""
    return KeyedCheckpoint(path, {**checkpoint_key(model), "window": window, "sink": sink,
                                  "tokens": token_digest(tokens, attention_mask)}, "streaming curve")


class _Evaluations:
    """NLL per set of streamed kv heads, computed once and kept in an optional checkpoint."""

    def __init__(self, model, info: ModelInfo, tokens, mask, window, sink, batch_size, checkpoint):
        self.model, self.info, self.tokens, self.mask = model, info, tokens, mask
        self.window, self.sink, self.batch_size = window, sink, batch_size
        self.state = None if checkpoint is None else stream_checkpoint(checkpoint, model, tokens, mask, window=window,
                                                                        sink=sink)
        saved = {} if self.state is None else self.state.load()[1].get("nll", {})
        self.done: dict[str, float] = {str(k): float(v) for k, v in saved.items()}
        self._replay: ReplayedForwards | None = None

    @property
    def replay(self) -> ReplayedForwards:
        """The baseline forward, with its residuals kept (run on first use, after every check)."""
        if self._replay is None:
            self._replay = ReplayedForwards(self.model, self.tokens, self.mask, batch_size=self.batch_size)
        return self._replay

    def nll(self, kv_heads: Sequence[int]) -> float:
        ids = sorted(int(k) for k in kv_heads)
        name = ",".join(map(str, ids))
        if name not in self.done:
            group = self.info.n_heads // self.info.n_kv_heads
            heads = [(k // self.info.n_kv_heads, (k % self.info.n_kv_heads) * group + g) for k in ids for g in range(group)]
            ablation = ablate_heads(self.model, heads, mode="window", window=self.window, sink=self.sink)
            self.done[name] = self.replay.mean_nll(ablation.fwd_hooks)
            if self.state is not None:
                self.state.save({}, {"nll": self.done})
        return self.done[name]


def streaming_curve(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    analysis: Any = None,
    *,
    fractions: float | Sequence[float] = DEFAULT_FRACTIONS,
    window: int = 64,
    sink: int = 4,
    orders: StreamingOrder | Sequence[StreamingOrder] = STREAMING_ORDERS,
    seeds: int = 3,
    attention_mask: Tensor | None = None,
    batch_size: int = 4,
    checkpoint: str | Path | None = None,
    types: HeadTypes | None = None,
    progress: bool = True,
) -> StreamingCurve:
    """ΔNLL on ``tokens`` when a growing fraction of kv heads stream (attend to the first ``sink``
    and the last ``window`` positions only), in the order of each rule: ``"taxonomy"`` (the share of
    winners beyond the window), ``"echo_induction"``, ``"entropy"``, ``"random"``, ``"oracle"``
    (docs/metrics.md#streaming).

    ``analysis``: an :class:`~tl_geometry.Analysis` (or its :class:`HeadTaxonomy`) of this model,
    needed for the ``"taxonomy"`` order; ``types``: this model's :class:`HeadTypes` if already
    measured (else measured here for ``"echo_induction"``). ``orders`` and ``fractions`` take one
    value alone too. Every set of kv heads is evaluated once (``checkpoint``: a file that a rerun
    with the same windows, window and sink resumes from, :mod:`~tl_geometry.run.checkpoint`). Costs one evaluation of ``tokens`` per kv head for the
    oracle, one per (order, fraction) otherwise, one forward of 101 tokens for the echo/induction
    scores and one pass over ``tokens`` for the entropies.
    """
    from tqdm.auto import tqdm

    info = describe_model(model)
    info.check_length(tokens.shape[-1])
    orders = tuple(dict.fromkeys((orders,) if isinstance(orders, str) else orders))
    fractions = (fractions,) if isinstance(fractions, int | float) else tuple(fractions)
    check_streaming_arguments(tokens.shape[-1], fractions, orders, window, sink, seeds)
    # The checkpoint first: a file that cannot be resumed is refused before any forward.
    evaluations = _Evaluations(model, info, tokens, attention_mask, window, sink, batch_size, checkpoint)
    taxonomy = getattr(analysis, "taxonomy", analysis)
    if "taxonomy" in orders:
        if not isinstance(taxonomy, HeadTaxonomy):
            raise TLGeometryError("the taxonomy order needs the analysis of this model: pass tlg.analyze(model, ...) "
                                  "(or its taxonomy) as analysis, or leave 'taxonomy' out of orders.")
        taxonomy.check_fits(info.n_layers, info.n_heads, "pass the analysis of this model")
    n_kv = info.n_layers * info.n_kv_heads
    needs: dict[str, Tensor] = {}
    if "taxonomy" in orders:
        needs["taxonomy"] = kv_head_needs(taxonomy_need(taxonomy, window), info.n_kv_heads)
    if "echo_induction" in orders:
        if types is None:
            types = head_types(model)
        if tuple(types.shape) != (info.n_layers, info.n_heads):
            raise TLGeometryError(f"the head types have {types.shape[0]}×{types.shape[1]} heads but this model has "
                                  f"{info.n_layers}×{info.n_heads}: pass the head types of this model.")
        needs["echo_induction"] = kv_head_needs((types.duplicate_token + types.induction).double(), info.n_kv_heads)
    if "entropy" in orders:  # head_importance's entropy importance is minus the mean entropy
        entropy = -head_importance(model, tokens, "entropy", attention_mask=attention_mask, batch_size=batch_size)
        needs["entropy"] = kv_head_needs(entropy.double(), info.n_kv_heads)
    baseline = evaluations.replay.baseline_nll
    if "oracle" in orders:
        alone = [evaluations.nll([k]) for k in tqdm(range(n_kv), desc="oracle (each kv head alone)", disable=not progress)]
        needs["oracle"] = ((torch.tensor(alone, dtype=torch.float64) - baseline) / baseline).reshape(info.n_layers, -1)
    order_of: dict[str, Tensor] = {name: torch.argsort(need.flatten(), stable=True) for name, need in needs.items()}
    if "random" in orders:
        order_of["random"] = torch.stack([torch.randperm(n_kv, generator=torch.Generator().manual_seed(seed))
                                          for seed in range(seeds)])
    # every order as rows of kv-head orders ([1, n] but random's [seeds, n]), its curve likewise
    rows = {name: order_of[name].reshape(-1, n_kv) for name in orders}
    curves = {name: torch.zeros(len(rows[name]), len(fractions), dtype=torch.float64) for name in orders}
    jobs = [(name, row, i) for name in orders for row in range(len(rows[name])) for i in range(len(fractions))]
    for name, row, i in tqdm(jobs, desc="streaming curve", disable=not progress):
        streamed = rows[name][row, :_count(fractions[i], n_kv)].tolist()
        curves[name][row, i] = ((evaluations.nll(streamed) if streamed else baseline) - baseline) / baseline
    curves = {name: curve if name == "random" else curve[0] for name, curve in curves.items()}
    settings = {"model": info.model_name, "window": window, "sink": sink, "seeds": seeds, "n_windows": tokens.shape[0],
                "seq_len": tokens.shape[-1], "n_kv_total": n_kv, "n_kv_heads": info.n_kv_heads}
    return StreamingCurve(tuple(float(f) for f in fractions), curves, order_of, needs, baseline, settings)
