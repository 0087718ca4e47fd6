"""Head ablation (docs/metrics.md#interventions): heads chosen by name or by regime, removed as
zero, mean, sink redirect or a streaming window, and the token-mean loss under any hooks.

Every ablation is TransformerLens forward hooks, so it composes with the user's own hooks and
with ``transformer_lens.patching``: an ablation is a context manager *and* a hook list. Losses
are next-token NLL in nats over the real (non-pad) predicted tokens, averaged over tokens;
``ΔNLL = (NLL_intervened − NLL) / NLL`` is relative.

Example:
    >>> tax = tlg.analyze(model, tokens).taxonomy                           # doctest: +SKIP
    >>> with tlg.intervene.ablate_regime(model, tax, "mixer"):                        # doctest: +SKIP
    ...     logits = model(tokens)
    >>> model.run_with_hooks(tokens, fwd_hooks=tlg.intervene.ablate_heads(model, [(3, 1)]).fwd_hooks)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, get_args

import torch
from jaxtyping import Int
from torch import Tensor

from ..capture.adapters import sequence_nll
from ..capture.hooks import (
    add_hooks,
    remove_hooks,
    sink_redirect_hooks,
    window_hooks,
    z_hook_name,
)
from ..capture.model_info import describe_model
from ..config import AblationMode
from ..errors import TLGeometryError
from ..heads import parse_heads
from ..label.taxonomy import HeadTaxonomy
from .residual_replay import token_mean

__all__ = ["HeadAblation", "ablate_heads", "ablate_regime", "check_window", "mean_nll", "ABLATION_MODES"]

ABLATION_MODES = get_args(AblationMode)


Head = tuple[int, int]


# Heads in TransformerLens's conventions (see heads.parse_heads): pairs, "L3H4" names, flat indices,
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


def window_batches(tokens: Tensor, mask: Tensor | None, batch_size: int):
    for start in range(0, tokens.shape[0], batch_size):
        rows = slice(start, start + batch_size)
        yield tokens[rows], None if mask is None else mask[rows]


@torch.no_grad()
def reference_means(model, layers: Sequence[int], tokens: Tensor, mask: Tensor | None,
                     batch_size: int = 8) -> dict[int, Tensor]:
    """Mean ``hook_z`` per layer over the non-pad positions of a reference batch, ``[head, d_head]``
    (its windows checked against the model's context first, as every model entry's are)."""
    describe_model(model).check_length(int(tokens.shape[-1]))
    sums: dict[int, Tensor] = {}
    count = torch.zeros((), dtype=torch.float64)
    for batch_tokens, batch_mask in window_batches(tokens, mask, batch_size):
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
        means = reference_means(model, list(by_layer), reference_tokens, reference_mask) if by_layer else {}
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
                          for batch_tokens, batch_mask in window_batches(tokens, attention_mask, batch_size))
