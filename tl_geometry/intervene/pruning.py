"""Jobs that remove heads and measure the loss (docs/metrics.md#interventions): pruning curves by
importance, the single-head scan, top-N attention deletion. Every evaluation runs from the first
layer it changes (:mod:`.residual_replay`)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..capture.hooks import (
    pattern_override_hooks,
    z_hook_name,
)
from ..capture.model_info import checkpoint_key, describe_model
from ..config import AblationMode
from ..errors import TLGeometryError
from ..io import token_digest
from ..measure.selection import top_order
from ..run.checkpoint import KeyedCheckpoint
from .ablation import Head, ablate_heads, reference_means
from .residual_replay import ReplayedForwards

__all__ = ["heads_to_remove", "pruning_curve", "scan_checkpoint", "single_head_scan", "TopNDeletion", "topn_deletion"]


def heads_to_remove(importance: Tensor, retention: float) -> list[Head]:
    """The lowest-importance heads (ties to the lower flat index) leaving ``retention`` of them."""
    if not 0 <= retention <= 1:
        raise TLGeometryError(f"retention must lie in [0, 1]; got {retention}.")
    n_heads = importance.shape[1]
    n_remove = importance.numel() - round(retention * importance.numel())
    order = torch.argsort(importance.flatten(), stable=True)[:n_remove]
    return [divmod(int(i), n_heads) for i in order.tolist()]


def pruning_curve(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    importances: Mapping[str, Tensor],
    retention: Sequence[float] = (1.0, 0.9, 0.75, 0.5, 0.25),
    *,
    attention_mask: Tensor | None = None,
    mode: AblationMode = "zero",
    batch_size: int = 8,
    progress: bool = True,
):
    """Relative ΔNLL on held-out ``tokens`` after removing the lowest-importance heads, per method
    and retention level. A DataFrame: ``method, retention, heads_removed, nll, baseline_nll,
    delta_nll, seq_len, n_windows``."""
    import pandas as pd
    from tqdm.auto import tqdm

    replay = ReplayedForwards(model, tokens, attention_mask, batch_size=batch_size)
    baseline = replay.baseline_nll
    rows = []
    jobs = [(name, r) for name in importances for r in retention]
    for name, r in tqdm(jobs, desc="pruning", disable=not progress):
        heads = heads_to_remove(importances[name], r)
        nll = baseline if not heads else replay.mean_nll(
            ablate_heads(model, heads, mode=mode, reference_tokens=tokens, reference_mask=attention_mask).fwd_hooks)
        rows.append({"method": name, "retention": r, "heads_removed": len(heads), "nll": nll,
                     "baseline_nll": baseline, "delta_nll": (nll - baseline) / baseline,
                     "seq_len": int(tokens.shape[1]), "n_windows": int(tokens.shape[0])})
    return pd.DataFrame(rows)


def scan_checkpoint(path: str | Path, model: Any, tokens: Tensor, attention_mask: Tensor | None = None,
                    mode: AblationMode = "zero") -> KeyedCheckpoint:
    """The checkpoint of :func:`single_head_scan` at ``path`` for these model, windows and mode
    (checked on opening; ``.problem()`` says why a saved one cannot be resumed)."""
    return KeyedCheckpoint(path, {**checkpoint_key(model), "mode": mode, "tokens": token_digest(tokens, attention_mask)},
                           "single-head scan")


def single_head_scan(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    *,
    attention_mask: Tensor | None = None,
    mode: AblationMode = "zero",
    batch_size: int = 8,
    checkpoint: str | Path | None = None,
    progress: bool = True,
) -> Float[Tensor, "layer head"]:
    """Relative ΔNLL of removing each head alone, ``[n_layers, n_heads]``.

    Exact and batched: every forward carries ``batch_size`` (window, head) replicas, each with its
    own head of the current layer ablated, so no Python loop runs per head. ``checkpoint``: a
    file (:mod:`~tl_geometry.run.checkpoint`) updated after every layer; a rerun with the same model,
    windows and mode resumes from it (a different run's file is refused before any forward).
    """
    from tqdm.auto import tqdm

    if mode not in ("zero", "mean"):
        raise TLGeometryError("single_head_scan supports mode 'zero' or 'mean'.")
    info = describe_model(model)
    info.check_length(tokens.shape[-1])
    result = torch.full((info.n_layers, info.n_heads), torch.nan, dtype=torch.float64)
    state = None if checkpoint is None else scan_checkpoint(checkpoint, model, tokens, attention_mask, mode)
    if state is not None:
        result = state.load()[0].get("delta_nll", result).double()
    replay = ReplayedForwards(model, tokens, attention_mask, batch_size=batch_size)
    baseline = replay.baseline_nll
    means = reference_means(model, list(range(info.n_layers)), tokens, attention_mask) if mode == "mean" else None
    n_win, heads = tokens.shape[0], info.n_heads
    # replica r ablates head r // n_win of window r % n_win; each layer's forwards start at that layer
    window_of, head_of = torch.arange(n_win).repeat(heads), torch.arange(heads).repeat_interleave(n_win)
    for layer in tqdm(range(info.n_layers), desc="single-head scan", disable=not progress):
        if not torch.isnan(result[layer]).any():
            continue
        nll_sum = torch.zeros(heads, dtype=torch.float64)
        count = torch.zeros(heads, dtype=torch.float64)
        for start in range(0, len(head_of), batch_size):
            rows = slice(start, start + batch_size)
            h_rows = head_of[rows]

            def replace(z: Tensor, hook, h_rows=h_rows, layer=layer) -> Tensor:
                z = z.clone()
                index = torch.arange(z.shape[0], device=z.device)
                z[index, :, h_rows] = 0 if means is None else means[layer][h_rows][:, None].to(z.dtype).to(z.device)
                return z

            nll, n = replay.nll(window_of[rows], [(z_hook_name(layer), replace)])
            nll_sum.index_add_(0, h_rows, nll)
            count.index_add_(0, h_rows, n.double())
        result[layer] = (nll_sum / count - baseline) / baseline
        if state is not None:
            state.save({"delta_nll": result})  # atomic: a killed scan keeps its last finished layer
    return result.float()


@dataclass
class TopNDeletion:
    """ΔNLL of keeping only the top-N sources of every query in every head (docs/metrics.md#interventions).

    Attributes:
        n: the N values; delta_nll: relative ΔNLL per N; renormalise: whether kept weights were
        renormalised; smallest_n: ``{0.01: N, 0.05: N, 0.10: N}`` the smallest N with ΔNLL ≤ τ
        (None if none).
    """

    n: tuple[int, ...]
    delta_nll: Float[Tensor, " n"]
    baseline_nll: float
    renormalise: bool
    smallest_n: dict[float, int | None]

    def to_dataframe(self):
        import pandas as pd

        return pd.DataFrame({"n": list(self.n), "delta_nll": self.delta_nll.double().numpy()})


def _keep_top_n(n: int, renormalise: bool) -> Callable[[Tensor], Tensor]:
    def keep(pattern: Tensor) -> Tensor:
        if n >= pattern.shape[-1]:
            return pattern
        keep = top_order(pattern, n)
        kept = torch.zeros_like(pattern).scatter_(-1, keep, pattern.gather(-1, keep))
        if renormalise:
            kept = kept / kept.sum(-1, keepdim=True).clamp_min(torch.finfo(kept.dtype).tiny)
        return kept

    return keep


def topn_deletion(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    n: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    *,
    renormalise: bool = False,
    attention_mask: Tensor | None = None,
    thresholds: Sequence[float] = (0.01, 0.05, 0.10),
    batch_size: int = 8,
    progress: bool = True,
    n_values: Sequence[int] | None = None,
) -> TopNDeletion:
    """At every query of every head keep the top-N sources (ties to the lower position) with their
    weights and zero the rest (optionally renormalised), during the forward; ΔNLL per N.
    Needs a model whose pattern can be overridden (HookedTransformer or TransformerLens 4.x).
    ``n_values``: the former name of ``n``, kept for one release."""
    from tqdm.auto import tqdm

    if n_values is not None:
        warnings.warn("topn_deletion(n_values=...) is now n=...; n_values goes in the next release.",
                      DeprecationWarning, stacklevel=2)
        n = n_values
    info = describe_model(model)
    ns = tuple(int(x) for x in n)
    if not ns or min(ns) < 1:
        raise TLGeometryError(f"n must be integers ≥ 1; got {list(n)}.")
    # every evaluation changes layer 0 on: nothing below it to replay, so nothing recorded
    replay = ReplayedForwards(model, tokens, attention_mask, batch_size=batch_size, memory=0)
    baseline = replay.baseline_nll
    deltas = []
    for kept in tqdm(ns, desc="top-N deletion", disable=not progress):
        hooks = [hook for layer in range(info.n_layers)
                 for hook in pattern_override_hooks(layer, _keep_top_n(kept, renormalise))]
        nll = replay.mean_nll(hooks)
        deltas.append((nll - baseline) / baseline)
    delta = torch.tensor(deltas, dtype=torch.float64)
    smallest = {tau: next((n for n, d in zip(ns, deltas, strict=True) if d <= tau), None) for tau in thresholds}
    return TopNDeletion(ns, delta, baseline, renormalise, smallest)
