"""Read attention patterns and value vectors from TransformerLens hook points.

Every TransformerLens version and model-class difference lives in ``capture/`` (here: the hooks
and the forward; :mod:`.model_info`: the configuration; :mod:`.cache`: caches); the metrics see
only tensors. Two model classes are supported by duck typing on the instance:

* ``HookedTransformer`` (TransformerLens 2.16 - 3.x),
* ``TransformerBridge`` (TransformerLens 3.x - 4.x).

Both expose ``blocks.{l}.attn.hook_pattern`` ``[batch, head, query, key]`` and
``blocks.{l}.attn.hook_v`` ``[batch, key, kv_head, d_head]`` (kv heads under GQA/MQA).

Layout convention of every :class:`LayerAttention`: sequences are *left-aligned* — token ``0``
of the tensors is the first non-pad token of the sequence (the sink, normally BOS) and pads,
if any, sit at the right. Left-padded batches are re-aligned here, so a sequence gives the same
tensors whatever its padding side or batch companions.

Example:
    >>> from tl_geometry.capture.adapters import stream_layers
    >>> shapes = {}
    >>> stream_layers(model, tokens, lambda l, att: shapes.setdefault(l, att.pattern.shape))  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ..errors import TLGeometryError
from .model_info import (
    ModelInfo,
    check_context,
    check_layers,
    check_tokens,
    check_vocabulary,
    context_length,
    describe_model,
    name_of,
)

__all__ = [
    "LayerAttention",
    "bos_flags",
    "unexplained_window",
    "names_filter",
    "check_attention_mask",
    "build_layer",
    "hook_names",
    "stream_layers",
    "align_value_heads",
    "sequence_nll",
]


def hook_names(layer: int) -> tuple[str, str]:
    """TransformerLens names of the pattern and value hooks of ``layer``."""
    return f"blocks.{layer}.attn.hook_pattern", f"blocks.{layer}.attn.hook_v"


@dataclass
class LayerAttention:
    """Attention of one layer, ready for geometry (left-aligned, in the model's dtype).

    Attributes:
        layer: layer index.
        pattern: ``[batch, head, query, key]`` post-softmax weights.
        kv_values: ``[batch, key, kv_head, d_head]`` value vectors of the model's own kv heads, as
            ``hook_v`` gives them (query head ``h`` reads kv head ``h // heads_per_kv``).
        key_mask: ``[batch, key]`` True for real (non-pad) tokens.
        query_mask: ``[batch, query]`` True for real (non-pad) query rows.
        has_bos: ``[batch]`` True where token 0 is the tokenizer's BOS (the sink), or where it
            cannot be known (no tokens or no BOS id: see ``bos_known``).
        window: the layer's sliding window (query ``t`` sees keys ``t − window + 1 .. t``), None
            where its queries see their whole causal prefix.
        bos_known: whether ``has_bos`` was read from tokens and a BOS id.
    """

    layer: int
    pattern: Float[Tensor, "batch head query key"]
    kv_values: Float[Tensor, "batch key kv_head d_head"]
    key_mask: Bool[Tensor, "batch key"]
    query_mask: Bool[Tensor, "batch query"]
    has_bos: Bool[Tensor, " batch"]
    window: int | None = None
    bos_known: bool = True

    @property
    def n_kv_heads(self) -> int:
        """Number of kv heads the model has (= query heads without GQA)."""
        return self.kv_values.shape[2]

    @property
    def heads_per_kv(self) -> int:
        """Query heads reading each kv head (1 without GQA)."""
        return self.pattern.shape[1] // self.n_kv_heads

    @property
    def visibility(self) -> dict[str, Any]:
        """Which sources each query sees, as the tensor functions take it: ``key_mask``,
        ``query_mask`` and ``window``, e.g. ``tlg.separability(att.pattern, att.kv_values, n,
        **att.visibility)``."""
        return {"key_mask": self.key_mask, "query_mask": self.query_mask, "window": self.window}

    @cached_property
    def v(self) -> Float[Tensor, "batch key head d_head"]:
        """Values aligned to *query* heads (``repeat_interleave``): a copy made on first use only;
        the analysis itself reads ``kv_values``."""
        return align_value_heads(self.kv_values, self.pattern.shape[1])


def align_value_heads(
    v: Float[Tensor, "batch key kv_head d_head"], n_heads: int
) -> Float[Tensor, "batch key head d_head"]:
    """Repeat kv heads so query head ``h`` reads kv head ``h // (n_heads // n_kv_heads)``.

    >>> align_value_heads(torch.zeros(1, 5, 3, 8), 9).shape
    torch.Size([1, 5, 9, 8])
    """
    n_kv = v.shape[2]
    if n_heads % n_kv:
        raise TLGeometryError(
            f"hook_v has {n_kv} kv heads, which does not divide the pattern's {n_heads} query heads; "
            "pass hook_v and hook_pattern of the same layer and model."
        )
    return v if n_kv == n_heads else v.repeat_interleave(n_heads // n_kv, dim=2)


def _left_align_index(mask: Bool[Tensor, "batch pos"]) -> Int[Tensor, "batch pos"] | None:
    """Gather index that moves each row's first real token to position 0 (None if no left pads)."""
    if bool(mask[:, 0].all()):
        return None
    pos = mask.shape[1]
    first = torch.where(mask.any(1), mask.int().argmax(1), torch.zeros_like(mask[:, 0], dtype=torch.long))
    return (torch.arange(pos, device=mask.device)[None, :] + first[:, None]) % pos


def check_attention_mask(mask: Tensor, batch: int, pos: int) -> Bool[Tensor, "batch pos"]:
    """``mask`` as booleans, refused unless it is ``[batch, pos]`` with one contiguous run of real
    tokens per row (left or right padding)."""
    if mask.shape != (batch, pos):
        raise TLGeometryError(
            f"attention_mask has shape {tuple(mask.shape)}, expected [batch, pos] = {(batch, pos)} "
            "matching tokens / hook_pattern."
        )
    mask = mask.bool()
    # A real token after a pad on both sides would be neither left nor right padding.
    starts = mask.int().argmax(1)
    lengths = mask.sum(1)
    ar = torch.arange(pos, device=mask.device)[None, :]
    contiguous = ((ar >= starts[:, None]) & (ar < (starts + lengths)[:, None])) == mask
    if not bool(contiguous.all()):
        raise TLGeometryError("attention_mask must mark one contiguous run of real tokens per row (left or right padding).")
    return mask


def build_layer(
    layer: int,
    pattern: Tensor,
    v: Tensor,
    mask: Tensor | None,
    has_bos: Tensor | None,
    window: int | None = None,
) -> LayerAttention:
    if pattern.ndim != 4:
        raise TLGeometryError(
            f"hook_pattern of layer {layer} has shape {tuple(pattern.shape)}; expected "
            "[batch, head, query_pos, key_pos]. Pass blocks.{l}.attn.hook_pattern, not hook_attn_scores/hook_z."
        )
    if v.ndim != 4:
        raise TLGeometryError(
            f"hook_v of layer {layer} has shape {tuple(v.shape)}; expected [batch, key_pos, kv_head, d_head]."
        )
    batch, n_heads, n_q, n_k = pattern.shape
    if n_q != n_k or v.shape[0] != batch or v.shape[1] != n_k:
        raise TLGeometryError(
            f"layer {layer}: hook_pattern {tuple(pattern.shape)} and hook_v {tuple(v.shape)} disagree; "
            "expected pattern [batch, head, pos, pos] and v [batch, pos, kv_head, d_head] from the same run."
        )
    # The model's own dtype: every consumer computes in float32 or wider, and the row checks fit
    # their tolerance to the dtype the softmax was computed in.
    pattern, v = pattern.detach(), v.detach()
    if n_heads % v.shape[2]:
        raise TLGeometryError(
            f"hook_v has {v.shape[2]} kv heads, which does not divide the pattern's {n_heads} query heads; "
            "pass hook_v and hook_pattern of the same layer and model."
        )
    mask = torch.ones(batch, n_k, dtype=torch.bool, device=pattern.device) if mask is None else check_attention_mask(
        mask.to(pattern.device), batch, n_k
    )
    index = _left_align_index(mask)
    if index is not None:
        mask = mask.gather(1, index)
        rows = index[:, None, :, None].expand(batch, n_heads, n_q, n_k)
        pattern = pattern.gather(2, rows).gather(3, index[:, None, None, :].expand(batch, n_heads, n_q, n_k))
        v = v.gather(1, index[:, :, None, None].expand_as(v))
    return LayerAttention(
        layer=layer,
        pattern=pattern,
        kv_values=v,
        key_mask=mask,
        query_mask=mask.clone(),
        has_bos=(torch.ones(batch, dtype=torch.bool) if has_bos is None else has_bos).to(pattern.device),
        window=window,
        bos_known=has_bos is not None,
    )


def bos_flags(tokens: Tensor | None, attention_mask: Tensor | None, bos_token_id: int | None) -> Tensor | None:
    """``[batch]`` whether each sequence's first real token is ``bos_token_id`` (None where that
    cannot be known: no tokens, or no BOS id)."""
    if tokens is None or bos_token_id is None:
        return None
    first = torch.zeros(tokens.shape[0], dtype=torch.long, device=tokens.device)
    if attention_mask is not None:
        first = attention_mask.bool().int().argmax(1).to(tokens.device)
    return tokens.gather(1, first[:, None])[:, 0].eq(bos_token_id).cpu()


def unexplained_window(att: LayerAttention) -> int | None:
    """The backstop for windows no configuration declared: the last query row of every sequence,
    in every head, puts weight exactly 0 on each visible position before its last ``W`` (``W ≥ 2``,
    and fewer than the positions it is taken to see), as a sliding window of ``W`` would. Returns
    that ``W`` (the longest such suffix over the sequences), else None. A softmax gives an exact 0
    only to a masked key (or one whose logit is ~100 below the row's best), so one head attending
    anywhere earlier, or one short sequence, rules it out."""
    mask = att.query_mask
    last = (mask.sum(1) - 1).clamp_min(0)  # left-aligned: the last real query
    batch, _, _, n_k = att.pattern.shape
    rows = att.pattern[torch.arange(batch, device=last.device)[:, None], :, last[:, None]][:, 0]  # [batch, head, key]
    positions = torch.arange(n_k, device=last.device)
    first = torch.zeros_like(last) if att.window is None else (last - att.window + 1).clamp_min(0)
    seen = (positions >= first[:, None]) & (positions <= last[:, None]) & att.key_mask
    weighted = (rows != 0) & seen[:, None, :]
    if not bool(weighted.any(-1).all()):
        return None
    earliest = torch.where(weighted, positions, n_k).amin(-1).amin(-1)  # [batch] over heads
    span = last - earliest + 1
    if not bool((earliest > first).all()) or int(span.max()) < 2:
        return None
    return int(span.max())


def names_filter(name: str) -> bool:
    """The hooks the geometry reads (``hook_pattern`` and ``hook_v`` of every layer): pass it to
    ``model.run_with_cache(tokens, names_filter=tlg.capture.names_filter)`` so the cache keeps only those."""
    return name.endswith((".attn.hook_pattern", ".attn.hook_v"))


class _Measured(Exception):
    """Raised by the last chosen layer's hook: its attention is measured, the forward may stop."""


def stream_layers(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    fn: Callable[[int, LayerAttention], None],
    *,
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    layers: Iterable[int] | None = None,
    stop_early: bool = True,
    info: ModelInfo | None = None,
) -> ModelInfo:
    """Run one forward pass and hand each chosen layer's attention to ``fn``.

    Hooks on ``hook_v`` and ``hook_pattern`` of the chosen layers build a
    :class:`LayerAttention` (with the layer's sliding window, where it has one) as soon as both
    tensors of a layer exist, call
    ``fn(layer, attention)``, and keep nothing: peak memory is one layer's attention, never a
    whole-model cache.

    Args:
        model: a ``HookedTransformer`` or ``TransformerBridge``.
        tokens: ``[batch, pos]`` token ids (include BOS: ``model.to_tokens`` does).
        fn: called once per chosen layer, in layer order.
        attention_mask: ``[batch, pos]`` 1 for real tokens, 0 for pads (left or right padding);
            default: no pads.
        layers: layer indices (default: all).
        stop_early: stop the forward once the last chosen layer's attention is measured (neither
            that layer's output nor the logits are needed).
        info: the model's :func:`describe_model`, when the caller streams many batches (saves
            describing, and warning about, the same model each time).

    Returns:
        The :class:`ModelInfo` of the model (class, sizes, processing mode).
    """
    info = describe_model(model) if info is None else info
    tokens = check_tokens(tokens)
    check_vocabulary(model, tokens)
    info.check_length(tokens.shape[1])
    chosen = check_layers(layers, info.n_layers)
    batch, pos = tokens.shape
    if attention_mask is not None:
        check_attention_mask(attention_mask, batch, pos)
    has_bos = bos_flags(tokens, attention_mask, info.bos_token_id)
    pending: dict[int, dict[str, Tensor]] = {}

    def make_hook(layer: int, kind: str):
        def hook(tensor: Tensor, hook=None) -> None:
            slot = pending.setdefault(layer, {})
            slot[kind] = tensor
            if len(slot) == 2:
                del pending[layer]
                fn(layer, build_layer(layer, slot["pattern"], slot["v"], attention_mask, has_bos, info.window(layer)))
                if stop_early and layer == chosen[-1]:
                    raise _Measured  # the rest of the forward (the layer's output, the unembedding) is not needed

        return hook

    fwd_hooks = []
    for layer in chosen:
        pattern_name, v_name = hook_names(layer)
        for name in (pattern_name, v_name):
            if name not in model.hook_dict:
                raise TLGeometryError(f"model has no hook point {name!r}; is this a TransformerLens transformer?")
        fwd_hooks += [(pattern_name, make_hook(layer, "pattern")), (v_name, make_hook(layer, "v"))]
    kwargs: dict[str, Any] = {"return_type": None}
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask.to(tokens.device)
    with torch.inference_mode(), contextlib.suppress(_Measured):
        model.run_with_hooks(tokens, fwd_hooks=fwd_hooks, **kwargs)
    if pending:
        raise TLGeometryError(
            f"layers {sorted(pending)} fired only one of hook_pattern / hook_v; this model's attention "
            "does not expose both hooks (a fused or non-eager attention implementation?). Load it with "
            "attn_implementation='eager'."
        )
    return info


def sequence_nll(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    *,
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    fwd_hooks: Iterable[tuple[str, Callable]] = (),
) -> tuple[Float[Tensor, " batch"], Int[Tensor, " batch"]]:
    """Summed next-token negative log-likelihood (nats; float32 per token, float64 sums) and the
    number of predicted tokens of each sequence, with optional hooks; pads are neither inputs nor
    targets."""
    tokens = check_tokens(tokens)
    check_vocabulary(model, tokens)
    check_context(name_of(model), context_length(model.cfg), tokens.shape[1])
    kwargs: dict[str, Any] = {"return_type": "logits"}
    if attention_mask is not None:
        check_attention_mask(attention_mask, *tokens.shape)
        kwargs["attention_mask"] = attention_mask.to(tokens.device)
    logits = model.run_with_hooks(tokens, fwd_hooks=list(fwd_hooks), **kwargs)
    # float32 cross-entropy (a float64 copy of [batch, pos, vocab] logits is 4 GB for Gemma's vocabulary)
    nll = torch.nn.functional.cross_entropy(
        logits[:, :-1].float().flatten(0, 1), tokens[:, 1:].flatten().to(logits.device), reduction="none"
    ).view(tokens.shape[0], -1).double()
    real = torch.ones_like(nll, dtype=torch.bool) if attention_mask is None else \
        attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
    return torch.where(real, nll, 0.0).sum(-1), real.sum(-1)
