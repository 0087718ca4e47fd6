"""What a model is, read once from its configuration: :class:`ModelInfo` (shape, dtype, context,
sliding windows, class, TransformerLens version and processing), the checks of tokens and layers
against it, and the attention weights of a layer. Every model-class difference in configuration
names lives here."""

from __future__ import annotations

import importlib.metadata
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..errors import TLGeometryError

__all__ = ["ModelInfo", "describe_model", "weights_fingerprint", "checkpoint_key", "pad_token_id", "attention_weights", "check_tokens", "check_vocabulary", "check_context", "check_layers", "context_length", "name_of", "tl_version"]

# Architectures whose value projection has a bias: folding it into b_O changes v_i.
_VALUE_BIAS_ARCHITECTURES = {
    "GPT2LMHeadModel", "GPTNeoXForCausalLM", "Qwen2ForCausalLM", "GPTNeoForCausalLM",
    "GPTJForCausalLM", "OPTForCausalLM", "BloomForCausalLM", "PhiForCausalLM", "NeoForCausalLM",
    "BertForMaskedLM", "Qwen2MoeForCausalLM",
}


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
        check_context(self.model_name, self.n_ctx, n_tokens)

    def window(self, layer: int) -> int | None:
        """The sliding window of ``layer`` (its queries see the last ``window`` positions), None
        where it sees the whole causal prefix."""
        return self.sliding_windows.get(layer)


def _weights_dtype(model: Any) -> str | None:
    weight = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return None if weight is None else str(weight.dtype).removeprefix("torch.")


def weights_fingerprint(model: Any) -> str:
    """A cheap digest of the model's weights as they are now: every parameter's name, shape, dtype,
    and float64 sum and norm (one read of each; no copy of the model). What a resumable job keys
    its checkpoint by, so a model loaded in another dtype, or edited in place, does not resume
    another's results. Equal for equal weights in one process and across runs."""
    import hashlib

    digest = hashlib.sha256()
    with torch.no_grad():
        for name, weight in model.named_parameters() if hasattr(model, "named_parameters") else ():
            total = float(weight.sum(dtype=torch.float64))
            norm = float(torch.linalg.vector_norm(weight, dtype=torch.float64))
            digest.update(f"{name}:{tuple(weight.shape)}:{weight.dtype}:{total!r}:{norm!r};".encode())
    return digest.hexdigest()


def checkpoint_key(model: Any) -> dict[str, Any]:
    """What every resumable job's checkpoint key says of the model: its name, shape, dtype and
    :func:`weights_fingerprint` (a bfloat16 model never resumes a float32 one's evaluations)."""
    info = describe_model(model)
    return {"model": info.model_name, "shape": [info.n_layers, info.n_heads, info.n_kv_heads], "dtype": info.dtype,
            "weights": weights_fingerprint(model)}


def name_of(model: Any) -> str:
    return str(getattr(model.cfg, "model_name", type(model).__name__))


def context_length(cfg: Any) -> int | None:
    n_ctx = getattr(cfg, "n_ctx", None)
    return int(n_ctx) if isinstance(n_ctx, int) and n_ctx > 0 else None


def check_context(model_name: str, n_ctx: int | None, n_tokens: int) -> None:
    if n_ctx is not None and n_tokens > n_ctx:
        raise TLGeometryError(
            f"{n_tokens} tokens per sequence exceed {model_name}'s context of {n_ctx}: cut the text "
            f"into windows of at most {n_ctx} tokens (tl_geometry.capture.corpus.make_windows, or a smaller --seq-len)."
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


def tl_version() -> str:
    try:
        return importlib.metadata.version("transformer-lens")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - TL is a dependency
        return "unknown"


REQUIRED_ATTRIBUTES = ("cfg", "run_with_hooks", "hook_dict", "blocks")


def _model_class(model: Any) -> str:
    missing = [name for name in REQUIRED_ATTRIBUTES if not hasattr(model, name)]
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
        model_name=name_of(model),
        transformer_lens_version=tl_version(),
        processing=_processing(model, model_class),
        bos_token_id=bos,
        n_ctx=context_length(cfg),
        sliding_windows=_sliding_windows(model, int(cfg.n_layers)),
        dtype=_weights_dtype(model),
    )


def pad_token_id(model: Any) -> int | None:
    """The model's tokenizer's pad id (None without a tokenizer or a pad token)."""
    pad = getattr(getattr(model, "tokenizer", None), "pad_token_id", None)
    return int(pad) if isinstance(pad, int) else None


def check_tokens(tokens: Any) -> Tensor:
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


def check_vocabulary(model: Any, tokens: Tensor) -> None:
    """Token ids must index the model's embedding (else the forward fails deep inside with
    ``IndexError: index out of range in self``)."""
    d_vocab = getattr(getattr(model, "cfg", None), "d_vocab", None)
    if tokens.numel() == 0 or not isinstance(d_vocab, int) or d_vocab <= 0:
        return
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= d_vocab:
        raise TLGeometryError(f"token ids must lie in 0..{d_vocab - 1} (the model's vocabulary); got ids from {low} to "
                              f"{high}: tokenise with this model's tokenizer (model.to_tokens).")


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


def check_layers(layers: Iterable[int] | None, n_layers: int) -> list[int]:
    if layers is None:
        return list(range(n_layers))
    chosen = sorted({int(layer) for layer in layers})
    bad = [layer for layer in chosen if not 0 <= layer < n_layers]
    if bad:
        raise TLGeometryError(f"layers {bad} are out of range: the model has layers 0..{n_layers - 1}.")
    if not chosen:
        raise TLGeometryError("layers is empty: pass None for all layers or a list of layer indices.")
    return chosen
