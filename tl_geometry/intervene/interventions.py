"""Interventions (docs/metrics.md#interventions): head ablation by regime, importance baselines, pruning, scans, top-N deletion.

All of them are TransformerLens forward hooks, so they compose with the user's own hooks and
with ``transformer_lens.patching``: an ablation is a context manager *and* a hook list.

Losses are next-token NLL in nats over the real (non-pad) predicted tokens, averaged over
tokens; ``ΔNLL = (NLL_intervened − NLL) / NLL`` is relative.

Example:
    >>> tax = tlg.analyze(model, tokens).taxonomy                           # doctest: +SKIP
    >>> with tlg.ablate_regime(model, tax, "mixer"):                        # doctest: +SKIP
    ...     logits = model(tokens)
    >>> model.run_with_hooks(tokens, fwd_hooks=tlg.ablate_heads(model, [(3, 1)]).fwd_hooks)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..capture.adapters import ModelInfo, attention_weights, describe_model, sequence_nll, stream_layers
from ..capture.hooks import (
    add_hooks,
    pattern_override_hooks,
    remove_hooks,
    sink_redirect_hooks,
    window_hooks,
    z_hook_name,
)
from ..config import AblationMode, ImportanceMethod
from ..errors import TLGeometryError
from ..io import parse_heads, token_digest
from ..label.taxonomy import HeadTaxonomy
from ..measure.selection import top_order
from ..run.checkpoint import KeyedCheckpoint
from .residual_replay import ReplayedForwards, token_mean

__all__ = [
    "HeadAblation", "ablate_heads", "ablate_regime", "head_importance",
    "mean_nll", "pruning_curve", "single_head_scan", "TopNDeletion", "topn_deletion",
]

ABLATION_MODES = get_args(AblationMode)
IMPORTANCE_METHODS = get_args(ImportanceMethod)
Head = tuple[int, int]
# Heads in TransformerLens's conventions (see io.parse_heads): pairs, "L3H4" names, flat indices,
# integer or boolean tensors.
Heads = Iterable[Head | str | int] | Tensor | str | int


class HeadAblation:
    """Ablation of a set of query heads. Use ``with ablation:`` or pass ``ablation.fwd_hooks`` to
    ``run_with_hooks``; leaving the context removes exactly these hooks."""

    def __init__(self, model: Any, fwd_hooks: list[tuple[str, Callable]], heads: list[Head], mode: AblationMode):
        self.model, self.fwd_hooks, self.heads, self.mode = model, fwd_hooks, heads, mode
        self._handles: list = []

    def __enter__(self) -> HeadAblation:
        if self._handles:  # a second entry would replace the handles of the first: a hook would stay
            raise TLGeometryError(f"{self!r} is already active: leave its with-block first, or build a second "
                                  "ablation with ablate_heads / ablate_regime to nest one.")
        self._handles = add_hooks(self.model, self.fwd_hooks)
        return self

    def __exit__(self, *exc) -> None:
        remove_hooks(self._handles)
        self._handles = []

    def __repr__(self) -> str:
        return f"HeadAblation(mode={self.mode!r}, heads={self.heads})"


def _check_heads(model: Any, heads: Heads) -> dict[int, list[int]]:
    info = describe_model(model)
    by_layer: dict[int, list[int]] = {}
    for layer, head in parse_heads(heads, info.n_layers, info.n_heads):
        by_layer.setdefault(layer, [])
        if head not in by_layer[layer]:
            by_layer[layer].append(head)
    return {layer: sorted(hs) for layer, hs in sorted(by_layer.items())}


def _batches(tokens: Tensor, mask: Tensor | None, batch_size: int):
    for start in range(0, tokens.shape[0], batch_size):
        rows = slice(start, start + batch_size)
        yield tokens[rows], None if mask is None else mask[rows]


@torch.no_grad()
def _reference_means(model, layers: Sequence[int], tokens: Tensor, mask: Tensor | None,
                     batch_size: int = 8) -> dict[int, Tensor]:
    """Mean ``hook_z`` per layer over the non-pad positions of a reference batch, ``[head, d_head]``."""
    sums: dict[int, Tensor] = {}
    count = torch.zeros((), dtype=torch.float64)
    for batch_tokens, batch_mask in _batches(tokens, mask, batch_size):
        real = torch.ones(batch_tokens.shape, dtype=torch.bool) if batch_mask is None else batch_mask.bool()

        def grab(z: Tensor, hook, real=real) -> None:
            layer = int(hook.name.split(".")[1])
            total = (z.double() * real[:, :, None, None].to(z.device)).sum((0, 1)).cpu()
            sums[layer] = sums.get(layer, 0) + total

        kwargs = {"return_type": None, "stop_at_layer": max(layers) + 1}
        if batch_mask is not None:
            kwargs["attention_mask"] = batch_mask
        model.run_with_hooks(batch_tokens, fwd_hooks=[(z_hook_name(layer), grab) for layer in layers], **kwargs)
        count += real.sum()
    if count == 0:
        raise TLGeometryError("the reference batch has no real token: mean ablation needs reference tokens.")
    return {layer: (total / count) for layer, total in sums.items()}


def ablate_heads(
    model: Any,
    heads: Heads,
    *,
    mode: AblationMode = "zero",
    reference_tokens: Int[Tensor, "batch pos"] | None = None,
    reference_mask: Int[Tensor, "batch pos"] | None = None,
    window: int = 64,
    sink: int = 4,
) -> HeadAblation:
    """Ablate query heads (individually, also under GQA), given in TransformerLens's conventions:
    ``[(layer, head), ...]``, ``["L3H4", ...]``, flat indices ``layer·n_heads + head`` (a list, or
    the integer tensor ``topk`` over a ``[n_layers, n_heads]`` tensor gives), or a boolean
    ``[n_layers, n_heads]`` mask.

    Modes: ``"zero"`` sets the head's ``hook_z`` slice to 0; ``"mean"`` to its mean over the
    non-pad positions of ``reference_tokens``; ``"sink"`` redirects its attention entirely to
    position 0 (``hook_pattern`` one-hot on the first token, which must be the sink: use right
    padding); ``"window"`` keeps only the first ``sink`` positions and the last ``window``
    positions up to the query, renormalised (StreamingLLM-style attention: exactly the scores of
    the other keys masked; right padding).
    """
    if mode not in ABLATION_MODES:
        raise TLGeometryError(f"mode must be one of {ABLATION_MODES}; got {mode!r}.")
    if mode == "window":
        check_window(window, sink)
    by_layer = _check_heads(model, heads)
    flat = [(layer, head) for layer, hs in by_layer.items() for head in hs]
    hooks: list[tuple[str, Callable]] = []
    if mode == "mean":
        if reference_tokens is None:
            raise TLGeometryError("mode='mean' needs reference_tokens (the batch whose mean replaces the head).")
        means = _reference_means(model, list(by_layer), reference_tokens, reference_mask) if by_layer else {}
    for layer, hs in by_layer.items():
        index = torch.tensor(hs)
        if mode == "sink":
            hooks += sink_redirect_hooks(layer, hs)
        elif mode == "window":
            hooks += window_hooks(layer, hs, window, sink)
        else:
            value = None if mode == "zero" else means[layer][index]

            def replace(z: Tensor, hook, index=index, value=value) -> Tensor:
                z = z.clone()
                z[:, :, index] = 0 if value is None else value.to(z.dtype).to(z.device)
                return z

            hooks.append((z_hook_name(layer), replace))
    return HeadAblation(model, hooks, flat, mode)


def check_window(window: int, sink: int, seq_len: int | None = None) -> None:
    """Refuse a window that is not one: ``window ≥ 1``, ``sink ≥ 0`` integers, and (given the
    sequence length) ``window + sink`` below it, where keeping them would keep every key."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise TLGeometryError(f"window must be an int ≥ 1 (the recent keys a streaming head keeps, the query "
                              f"included); got {window!r}.")
    if isinstance(sink, bool) or not isinstance(sink, int) or sink < 0:
        raise TLGeometryError(f"sink must be an int ≥ 0 (the first positions a streaming head keeps); got {sink!r}.")
    if seq_len is not None and window + sink >= seq_len:
        raise TLGeometryError(f"window + sink = {window + sink} keeps every key of {seq_len}-token windows: streaming "
                              "would change nothing; use a smaller window or longer windows.")


def ablate_regime(
    model: Any,
    taxonomy: HeadTaxonomy,
    regime: str,
    *,
    k: int | None = None,
    seed: int = 0,
    mode: AblationMode = "zero",
    reference_tokens: Tensor | None = None,
    reference_mask: Tensor | None = None,
    window: int = 64,
    sink: int = 4,
) -> HeadAblation:
    """Ablate every head of ``regime`` (``"retriever" | "mixer" | "reset"``), or a seeded random ``k`` of them
    (modes and ``window``/``sink`` as in :func:`ablate_heads`).
    The taxonomy must have the model's grid of heads (another model's taxonomy is refused)."""
    info = describe_model(model)
    taxonomy.check_fits(info.n_layers, info.n_heads, "use the taxonomy of an analysis of this model")
    heads = taxonomy.heads(regime)
    if k is not None:
        if not 0 <= k <= len(heads):
            raise TLGeometryError(f"k={k} is out of range: the taxonomy has {len(heads)} {regime} heads.")
        pick = torch.randperm(len(heads), generator=torch.Generator().manual_seed(seed))[:k].sort().values
        heads = [heads[i] for i in pick.tolist()]
    return ablate_heads(model, heads, mode=mode, reference_tokens=reference_tokens, reference_mask=reference_mask,
                        window=window, sink=sink)


def mean_nll(model: Any, tokens: Tensor, *, attention_mask: Tensor | None = None,
             fwd_hooks: Iterable[tuple[str, Callable]] = (), batch_size: int = 8) -> float:
    """Token-averaged next-token NLL (nats) over all windows, under optional hooks."""
    hooks = list(fwd_hooks)
    with torch.no_grad():
        return token_mean(sequence_nll(model, batch_tokens, attention_mask=batch_mask, fwd_hooks=hooks)
                          for batch_tokens, batch_mask in _batches(tokens, attention_mask, batch_size))


# ----- importance ------------------------------------------------------------------------------

def _magnitude(model, info: ModelInfo) -> Tensor:
    rows = []
    for layer in range(info.n_layers):
        weights = attention_weights(model, layer)
        rows.append(sum(w.double().pow(2).sum((1, 2)) for w in weights.values()).sqrt())
    return torch.stack(rows).float()


def _entropy(model, info: ModelInfo, tokens, mask, batch_size) -> Tensor:
    sums = torch.zeros(info.n_layers, info.n_heads, dtype=torch.float64)
    count = torch.zeros((), dtype=torch.float64)

    def on_layer(layer, att):
        p = att.pattern.double()
        entropy = -(p * p.clamp_min(1e-300).log()).sum(-1)  # [batch, head, query]
        sums[layer] += (entropy * att.query_mask[:, None, :]).sum((0, 2)).cpu()

    for batch_tokens, batch_mask in _batches(tokens, mask, batch_size):
        stream_layers(model, batch_tokens, on_layer, attention_mask=batch_mask, info=info)
        count += batch_tokens.numel() if batch_mask is None else batch_mask.sum()
    return (-(sums / count)).float()  # diffuse (high-entropy) heads are removed first


def _gradient(model, info: ModelInfo, tokens, mask, batch_size) -> Tensor:
    """Michel et al. (2019): E_x |∂L(x)/∂ξ_h| for a gate ξ on each head's hook_z, ℓ2-normalised per layer."""
    total = torch.zeros(info.n_layers, info.n_heads, dtype=torch.float64)
    n_seq = 0
    for batch_tokens, batch_mask in _batches(tokens, mask, batch_size):
        # One gate per sequence and head: one backward gives every sequence's own gradient.
        gates = torch.ones(batch_tokens.shape[0], info.n_layers, info.n_heads, requires_grad=True)

        def gate(z: Tensor, hook, gates=gates) -> Tensor:
            layer = int(hook.name.split(".")[1])
            return z * gates[:, layer, None, :, None].to(z.dtype).to(z.device)

        with torch.enable_grad():
            nll, n = sequence_nll(model, batch_tokens, attention_mask=batch_mask,
                                  fwd_hooks=[(z_hook_name(layer), gate) for layer in range(info.n_layers)])
            # autograd.grad, not backward(): the model's own .grad stays untouched
            (grad,) = torch.autograd.grad((nll / n.clamp_min(1)).sum(), gates)
        total += grad.abs().double().sum(0)
        n_seq += batch_tokens.shape[0]
    mean = total / n_seq
    return (mean / mean.norm(dim=1, keepdim=True).clamp_min(1e-30)).float()


def taxonomy_importance(taxonomy: HeadTaxonomy) -> Float[Tensor, "layer head"]:
    """Importance from taxonomy outputs only: mixers (0) < resets (1) < retrievers (2), and within
    a regime, the larger a head's share of sink votes the less important (``base + 1 − share_sink``).
    The lowest are removed first."""
    base = torch.tensor([2.0, 0.0, 1.0])[taxonomy.label_ids]  # retriever, mixer, reset
    return base + 1 - taxonomy.shares[..., 1].nan_to_num(0.0)


def head_importance(
    model: Any,
    tokens: Int[Tensor, "batch pos"] | None = None,
    method: ImportanceMethod = "gradient",
    *,
    attention_mask: Tensor | None = None,
    taxonomy: HeadTaxonomy | None = None,
    seed: int = 0,
    batch_size: int = 8,
) -> Float[Tensor, "layer head"]:
    """Per-head importance ``[n_layers, n_heads]`` (higher = keep longer).

    Methods: ``"magnitude"`` (Frobenius norm of the head's ``W_Q``, ``W_K``, ``W_V``, ``W_O``
    slices together; K and V are those of the kv head it reads), ``"entropy"`` (minus the mean
    attention entropy over non-pad queries: diffuse heads go first), ``"gradient"`` (Michel et
    al. 2019), ``"random"`` (seeded uniform), ``"taxonomy"`` (:func:`taxonomy_importance`; pass
    ``taxonomy`` or it is computed from ``tokens``).
    """
    if method not in IMPORTANCE_METHODS:
        raise TLGeometryError(f"method must be one of {IMPORTANCE_METHODS}; got {method!r}.")
    info = describe_model(model)
    if tokens is not None:
        info.check_length(tokens.shape[-1])
    if method == "magnitude":
        return _magnitude(model, info)
    if method == "random":
        return torch.rand(info.n_layers, info.n_heads, generator=torch.Generator().manual_seed(seed))
    if method == "taxonomy" and taxonomy is not None:
        return taxonomy_importance(taxonomy)
    if tokens is None:
        raise TLGeometryError(f"method {method!r} needs tokens.")
    if method == "taxonomy":  # the taxonomy's pass, with the least geometry beside it
        from ..run.analysis import analyze

        run = analyze(model, tokens, 1, attention_mask=attention_mask, repeats=0, sink=False, bootstrap=1,
                      batch_size=batch_size, progress=False)
        return taxonomy_importance(run.taxonomy)
    if method == "entropy":
        return _entropy(model, info, tokens, attention_mask, batch_size)
    return _gradient(model, info, tokens, attention_mask, batch_size)


# ----- pruning and scans ---------------------------------------------------------------------

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
    info = describe_model(model)
    return KeyedCheckpoint(path, {"model": info.model_name, "shape": [info.n_layers, info.n_heads], "mode": mode,
                                  "tokens": token_digest(tokens, attention_mask)}, "single-head scan")


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
    file (:mod:`~tl_geometry.checkpoint`) updated after every layer; a rerun with the same model,
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
    means = _reference_means(model, list(range(info.n_layers)), tokens, attention_mask) if mode == "mean" else None
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


# ----- top-N attention deletion ----------------------------------------------------------------

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
    n_values: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    *,
    renormalise: bool = False,
    attention_mask: Tensor | None = None,
    thresholds: Sequence[float] = (0.01, 0.05, 0.10),
    batch_size: int = 8,
    progress: bool = True,
) -> TopNDeletion:
    """At every query of every head keep the top-N sources (ties to the lower position) with their
    weights and zero the rest (optionally renormalised), during the forward; ΔNLL per N.
    Needs a model whose pattern can be overridden (HookedTransformer or TransformerLens 4.x)."""
    from tqdm.auto import tqdm

    info = describe_model(model)
    ns = tuple(int(x) for x in n_values)
    if not ns or min(ns) < 1:
        raise TLGeometryError(f"n_values must be integers ≥ 1; got {list(n_values)}.")
    # every evaluation changes layer 0 on: nothing below it to replay, so nothing recorded
    replay = ReplayedForwards(model, tokens, attention_mask, batch_size=batch_size, memory=0)
    baseline = replay.baseline_nll
    deltas = []
    for n in tqdm(ns, desc="top-N deletion", disable=not progress):
        hooks = [hook for layer in range(info.n_layers) for hook in pattern_override_hooks(layer, _keep_top_n(n, renormalise))]
        nll = replay.mean_nll(hooks)
        deltas.append((nll - baseline) / baseline)
    delta = torch.tensor(deltas, dtype=torch.float64)
    smallest = {tau: next((n for n, d in zip(ns, deltas, strict=True) if d <= tau), None) for tau in thresholds}
    return TopNDeletion(ns, delta, baseline, renormalise, smallest)
