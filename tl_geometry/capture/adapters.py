"""Read attention patterns and value vectors from TransformerLens hook points.

Every TransformerLens version and model-class difference lives here; the metrics see only
tensors. Two model classes are supported by duck typing on the instance:

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
import importlib.metadata
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ..errors import TLGeometryError

__all__ = [
    "LayerAttention",
    "ModelInfo",
    "describe_model",
    "describe_cache",
    "bos_flags",
    "unexplained_window",
    "batched_cache",
    "pad_token_id",
    "names_filter",
    "check_attention_mask",
    "hook_names",
    "read_layer",
    "stream_layers",
    "align_value_heads",
    "attention_weights",
    "sequence_nll",
]

# Architectures whose value projection has a bias: folding it into b_O changes v_i.
_VALUE_BIAS_ARCHITECTURES = {
    "GPT2LMHeadModel", "GPTNeoXForCausalLM", "Qwen2ForCausalLM", "GPTNeoForCausalLM",
    "GPTJForCausalLM", "OPTForCausalLM", "BloomForCausalLM", "PhiForCausalLM", "NeoForCausalLM",
    "BertForMaskedLM", "Qwen2MoeForCausalLM",
}


def hook_names(layer: int) -> tuple[str, str]:
    """TransformerLens names of the pattern and value hooks of ``layer``."""
    return f"blocks.{layer}.attn.hook_pattern", f"blocks.{layer}.attn.hook_v"


@runtime_checkable
class HookCache(Protocol):
    """What the adapters read hooks from: an ``ActivationCache`` or a plain dict keyed by hook name."""

    def __getitem__(self, name: str) -> Tensor: ...

    def keys(self) -> Iterable[str]: ...


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


@dataclass
class ModelInfo:
    """What the adapters learned about a model instance (recorded with every result)."""

    model_class: str  # "HookedTransformer" | "TransformerBridge"
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    model_name: str
    transformer_lens_version: str
    processing: dict[str, Any] = field(default_factory=dict)
    bos_token_id: int | None = None
    n_ctx: int | None = None  # the context length, when the config states it
    # Layers whose queries see only the last ``window`` positions (sliding-window attention), by layer.
    sliding_windows: dict[int, int] = field(default_factory=dict)
    dtype: str | None = None  # of the weights, e.g. "bfloat16" (None for a cache)

    def check_length(self, n_tokens: int) -> None:
        """Refuse sequences longer than the model's context before any forward (memory grows
        with its square, and positions past it mean nothing to the model)."""
        _check_context(self.model_name, self.n_ctx, n_tokens)

    def window(self, layer: int) -> int | None:
        """The sliding window of ``layer`` (its queries see the last ``window`` positions), None
        where it sees the whole causal prefix."""
        return self.sliding_windows.get(layer)


def _weights_dtype(model: Any) -> str | None:
    weight = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return None if weight is None else str(weight.dtype).removeprefix("torch.")


def _model_name(model: Any) -> str:
    return str(getattr(model.cfg, "model_name", type(model).__name__))


def _context(cfg: Any) -> int | None:
    n_ctx = getattr(cfg, "n_ctx", None)
    return int(n_ctx) if isinstance(n_ctx, int) and n_ctx > 0 else None


def _check_context(model_name: str, n_ctx: int | None, n_tokens: int) -> None:
    if n_ctx is not None and n_tokens > n_ctx:
        raise TLGeometryError(
            f"{n_tokens} tokens per sequence exceed {model_name}'s context of {n_ctx}: cut the text "
            f"into windows of at most {n_ctx} tokens (tlg.make_windows, or a smaller --seq-len)."
        )


def _sliding_windows(model: Any, n_layers: int) -> dict[int, int]:
    """The layers with sliding-window attention and their windows, from whichever configuration
    style the model has: a HookedTransformer's (``use_local_attn``, ``attn_types``,
    ``window_size``), else the Hugging Face config a TransformerBridge wraps — ``sliding_window``
    with ``layer_types`` (Gemma 2/3, recent Qwen2 and Mistral), ``use_sliding_window`` with
    ``max_window_layers`` (Qwen2 before ``layer_types``), ``sliding_window`` alone (Mistral: every
    layer), or GPT-Neo's ``window_size`` with ``attention_layers``."""
    cfg = model.cfg
    if getattr(cfg, "use_local_attn", False) and isinstance(getattr(cfg, "window_size", None), int):
        kinds = getattr(cfg, "attn_types", None) or ["local"] * n_layers
        return {layer: int(cfg.window_size) for layer, kind in enumerate(kinds) if kind == "local"}
    hf = getattr(getattr(model, "original_model", None), "config", None)
    hf = getattr(hf, "text_config", hf)  # multimodal configs keep the language model's apart
    return _hugging_face_windows(hf, n_layers) if hf is not None else {}


def _hugging_face_windows(hf: Any, n_layers: int) -> dict[int, int]:
    """:func:`_sliding_windows` of a Hugging Face config."""
    neo_layers = getattr(hf, "attention_layers", None)
    if isinstance(neo_layers, list | tuple) and isinstance(getattr(hf, "window_size", None), int):  # GPT-Neo
        return {layer: int(hf.window_size) for layer, kind in enumerate(neo_layers) if kind == "local"}
    window = getattr(hf, "sliding_window", None)
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return {}
    kinds = getattr(hf, "layer_types", None)
    if kinds is not None:
        return {layer: window for layer, kind in enumerate(kinds) if kind in ("sliding_attention", "local")}
    if getattr(hf, "use_sliding_window", True) is False:
        return {}
    first = getattr(hf, "max_window_layers", None)  # Qwen2: layers from this index on slide
    first = first if isinstance(first, int) and hasattr(hf, "use_sliding_window") else 0
    return {layer: window for layer in range(first, n_layers)}


def _tl_version() -> str:
    try:
        return importlib.metadata.version("transformer-lens")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - TL is a dependency
        return "unknown"


_REQUIRED = ("cfg", "run_with_hooks", "hook_dict", "blocks")


def _model_class(model: Any) -> str:
    missing = [name for name in _REQUIRED if not hasattr(model, name)]
    if missing:
        raise TLGeometryError(
            f"{type(model).__name__} is not a TransformerLens model: it lacks {', '.join(missing)}. "
            "Pass a HookedTransformer (TransformerLens 2.x/3.x) or a TransformerBridge "
            "(TransformerLens 3.x/4.x), e.g. tl_geometry.load_model('smollm2-135m')."
        )
    # The bridge wraps a Hugging Face module; HookedTransformer owns its weights.
    if hasattr(model, "original_model") or (hasattr(model, "adapter") and hasattr(model, "boot_transformers")):
        return "TransformerBridge"
    return "HookedTransformer"


def _processing(model: Any, model_class: str) -> dict[str, Any]:
    cfg = model.cfg
    arch = getattr(cfg, "original_architecture", None) or getattr(cfg, "architecture", None)
    has_value_bias = arch in _VALUE_BIAS_ARCHITECTURES
    info: dict[str, Any] = {"architecture": arch}
    if model_class == "TransformerBridge":
        compat = bool(getattr(model, "compatibility_mode", False))
        info["compatibility_mode"] = compat
        # Compatibility mode processes weights the HookedTransformer way (value biases folded).
        info["value_bias_folded"] = bool(compat and has_value_bias)
    else:
        b_v = [getattr(block.attn, "b_V", None) for block in model.blocks]
        zero_bias = all(b is None or not torch.any(b) for b in b_v)
        info["value_bias_folded"] = bool(has_value_bias and zero_bias)
    if info["value_bias_folded"]:
        warnings.warn(
            f"{arch} has value biases and this model's weights were processed (fold_value_biases): "
            "hook_v no longer holds the original value vectors, so geometry differs from the "
            "unprocessed model. Load with fold_value_biases=False (HookedTransformer) or without "
            "enable_compatibility_mode() (TransformerBridge) for the paper's v_i.",
            stacklevel=3,
        )
    return info


def describe_model(model: Any) -> ModelInfo:
    """Check that ``model`` is a causal TransformerLens model and describe it.

    Raises:
        TypeError: not a TransformerLens model (says which attributes are missing).
        ValueError: a non-causal (bidirectional) model.
    """
    model_class = _model_class(model)
    cfg = model.cfg
    direction = getattr(cfg, "attention_dir", "causal")
    if direction != "causal":
        raise TLGeometryError(
            f"model attention is {direction!r}: geometric separability is defined over the causal "
            "sources 0..t of each query. Use a causal (decoder-only) model."
        )
    n_heads = int(cfg.n_heads)
    n_kv = getattr(cfg, "n_key_value_heads", None) or n_heads
    tokenizer = getattr(model, "tokenizer", None)
    bos = getattr(tokenizer, "bos_token_id", None) if tokenizer is not None else None
    return ModelInfo(
        model_class=model_class,
        n_layers=int(cfg.n_layers),
        n_heads=n_heads,
        n_kv_heads=int(n_kv),
        d_head=int(cfg.d_head),
        model_name=_model_name(model),
        transformer_lens_version=_tl_version(),
        processing=_processing(model, model_class),
        bos_token_id=bos,
        n_ctx=_context(cfg),
        sliding_windows=_sliding_windows(model, int(cfg.n_layers)),
        dtype=_weights_dtype(model),
    )


def pad_token_id(model: Any) -> int | None:
    """The model's tokenizer's pad id (None without a tokenizer or a pad token)."""
    pad = getattr(getattr(model, "tokenizer", None), "pad_token_id", None)
    return int(pad) if isinstance(pad, int) else None


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


def _build_layer(
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
    ``model.run_with_cache(tokens, names_filter=tlg.names_filter)`` so the cache keeps only those."""
    return name.endswith((".attn.hook_pattern", ".attn.hook_v"))


def is_cache(obj: Any) -> bool:
    """An ``ActivationCache`` or a plain mapping of hook names to tensors (not a model)."""
    return isinstance(obj, Mapping) or (hasattr(obj, "cache_dict") and not hasattr(obj, "run_with_hooks"))


def _cached_layers(cache: Any) -> list[int]:
    """The layers whose ``hook_pattern`` or ``hook_v`` the cache holds, in order."""
    keys = list(cache.keys()) if hasattr(cache, "keys") else []
    return sorted({int(k.split(".")[1]) for k in keys if names_filter(k) and k.split(".")[1].isdigit()})


class _BatchedCache:
    """A ``remove_batch_dim=True`` cache seen with its one sequence as a batch of one (the
    pattern and value hooks only; the cache's ``model`` kept)."""

    def __init__(self, cache: Any):
        self._cache = cache
        self.model = getattr(cache, "model", None)
        self._names = [name for name in cache.keys() if name.endswith(("attn.hook_pattern", "attn.hook_v"))]

    def __getitem__(self, name: str) -> Tensor:
        return self._cache[name][None]

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def keys(self) -> list[str]:
        return list(self._names)


def batched_cache(cache: Any) -> Any:
    """``cache`` with a batch axis: a ``remove_batch_dim=True`` cache (``hook_pattern`` of
    ``[head, pos, pos]``) as a batch of one sequence; any other cache as it is."""
    name = next((key for key in cache.keys() if key.endswith("attn.hook_pattern")), None)
    value = None if name is None else name.replace("hook_pattern", "hook_v")
    if name is not None and value in cache and cache[name].ndim == 3 and cache[value].ndim == 3:
        return _BatchedCache(cache)
    return cache


def describe_cache(cache: Any) -> ModelInfo:
    """The :class:`ModelInfo` of the model a cache came from: the model's own when the cache
    knows it (``ActivationCache.model``), else read from the cached shapes. Every layer
    ``0..L-1`` must hold ``hook_pattern`` and ``hook_v``."""
    layers = _cached_layers(cache)
    if not layers:
        raise TLGeometryError("the cache holds no blocks.{l}.attn.hook_pattern / hook_v: run "
                              "model.run_with_cache(tokens, names_filter=tlg.names_filter).")
    missing = [name for layer in range(layers[-1] + 1) for name in hook_names(layer) if name not in cache]
    if missing:
        raise TLGeometryError(f"the cache lacks {', '.join(missing[:4])}{' …' if len(missing) > 4 else ''}: the "
                              "analysis reads every layer; run model.run_with_cache(tokens, names_filter=tlg.names_filter).")
    model = getattr(cache, "model", None)
    if model is not None and all(hasattr(model, name) for name in _REQUIRED):
        info = describe_model(model)
        if info.n_layers == len(layers):
            return info
    pattern, v = cache[hook_names(0)[0]], cache[hook_names(0)[1]]
    if pattern.ndim != 4 or v.ndim != 4:
        raise TLGeometryError(f"cached hook_pattern {tuple(pattern.shape)} / hook_v {tuple(v.shape)}: expected "
                              "[batch, head, pos, pos] and [batch, pos, kv_head, d_head].")
    return ModelInfo(model_class="cache", n_layers=len(layers), n_heads=int(pattern.shape[1]),
                     n_kv_heads=int(v.shape[2]), d_head=int(v.shape[3]), model_name="unknown (a cache)",
                     transformer_lens_version=_tl_version())


def read_layer(
    cache: HookCache,
    layer: int,
    *,
    attention_mask: Int[Tensor, "batch pos"] | None = None,
    tokens: Int[Tensor, "batch pos"] | None = None,
    bos_token_id: int | None = None,
    window: int | None = None,
) -> LayerAttention:
    """Read one layer from an ``ActivationCache`` or a plain dict keyed by hook name.

    Args:
        cache: holds ``blocks.{layer}.attn.hook_pattern`` and ``blocks.{layer}.attn.hook_v``.
        layer: layer index.
        attention_mask: ``[batch, pos]`` 1 for real tokens, 0 for pads (default: no pads).
        tokens, bos_token_id: when given, ``has_bos`` says whether each sequence starts with BOS;
            otherwise it is assumed True (``bos_known`` False).
        window: the layer's sliding window (``describe_model(model).window(layer)``), if it has one.

    Example:
        >>> _, cache = model.run_with_cache(tokens)       # doctest: +SKIP
        >>> att = read_layer(cache, 3)                    # doctest: +SKIP
        >>> att.pattern.shape, att.v.shape                # doctest: +SKIP
        (torch.Size([2, 9, 12, 12]), torch.Size([2, 12, 9, 64]))
    """
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise TLGeometryError(f"layer must be a non-negative int, got {layer!r}.")
    names = hook_names(layer)
    cache = batched_cache(cache)
    missing = [name for name in names if name not in cache]
    if missing:
        n_layers = len(_cached_layers(cache))
        hint = f" (the cache has hooks of {n_layers} layers)" if n_layers else ""
        raise TLGeometryError(
            f"cache lacks {', '.join(missing)}{hint}. Run model.run_with_cache(tokens, "
            "names_filter=tlg.names_filter) for the layers you need."
        )
    pattern, v = cache[names[0]], cache[names[1]]
    return _build_layer(layer, pattern, v, attention_mask, bos_flags(tokens, attention_mask, bos_token_id), window)


def _check_layers(layers: Iterable[int] | None, n_layers: int) -> list[int]:
    if layers is None:
        return list(range(n_layers))
    chosen = sorted({int(layer) for layer in layers})
    bad = [layer for layer in chosen if not 0 <= layer < n_layers]
    if bad:
        raise TLGeometryError(f"layers {bad} are out of range: the model has layers 0..{n_layers - 1}.")
    if not chosen:
        raise TLGeometryError("layers is empty: pass None for all layers or a list of layer indices.")
    return chosen


def _check_tokens(tokens: Any) -> Tensor:
    if not isinstance(tokens, Tensor) or tokens.dtype not in (torch.int64, torch.int32):
        raise TLGeometryError(
            "tokens must be an integer tensor [batch, pos] (e.g. model.to_tokens(texts)); "
            f"got {type(tokens).__name__}{'' if not isinstance(tokens, Tensor) else ' of ' + str(tokens.dtype)}."
        )
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2 or tokens.shape[1] < 1:
        raise TLGeometryError(f"tokens must have shape [batch, pos], got {tuple(tokens.shape)}.")
    return tokens


def _check_vocabulary(model: Any, tokens: Tensor) -> None:
    """Token ids must index the model's embedding (else the forward fails deep inside with
    ``IndexError: index out of range in self``)."""
    d_vocab = getattr(getattr(model, "cfg", None), "d_vocab", None)
    if tokens.numel() == 0 or not isinstance(d_vocab, int) or d_vocab <= 0:
        return
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= d_vocab:
        raise TLGeometryError(f"token ids must lie in 0..{d_vocab - 1} (the model's vocabulary); got ids from {low} to "
                              f"{high}: tokenise with this model's tokenizer (model.to_tokens).")


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
    tokens = _check_tokens(tokens)
    _check_vocabulary(model, tokens)
    info.check_length(tokens.shape[1])
    chosen = _check_layers(layers, info.n_layers)
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
                fn(layer, _build_layer(layer, slot["pattern"], slot["v"], attention_mask, has_bos, info.window(layer)))
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


def attention_weights(model: Any, layer: int) -> dict[str, Tensor]:
    """Per *query* head weight slices of one layer: ``W_Q``, ``W_K``, ``W_V`` ``[head, d_model, d_head]``
    (K and V of the kv head the query head reads, expanded under GQA) and ``W_O`` ``[head, d_head, d_model]``.

    HookedTransformer exposes K/V already expanded to query heads; TransformerBridge per kv head.
    """
    attn = model.blocks[layer].attn
    n_heads = model.cfg.n_heads
    out = {}
    for name in ("W_Q", "W_K", "W_V", "W_O"):
        weight = getattr(attn, name, None)
        if weight is None:
            raise AttributeError(f"layer {layer} attention has no {name}; weight-based importance needs it.")
        weight = weight.detach()
        if weight.shape[0] != n_heads:  # kv heads (GQA / MQA)
            weight = weight.repeat_interleave(n_heads // weight.shape[0], 0)
        out[name] = weight
    return out


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
    tokens = _check_tokens(tokens)
    _check_vocabulary(model, tokens)
    _check_context(_model_name(model), _context(model.cfg), tokens.shape[1])
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
