"""Reading a cache instead of a model: ``ActivationCache`` or any mapping of hook names to tensors,
one layer at a time (:func:`read_layer`), its :class:`~tl_geometry.capture.model_info.ModelInfo`
(:func:`describe_cache`) and the batches of a cache too large for one pass."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from jaxtyping import Int
from torch import Tensor

from ..errors import TLGeometryError
from .adapters import LayerAttention, bos_flags, build_layer, hook_names, names_filter
from .model_info import REQUIRED_ATTRIBUTES, ModelInfo, describe_model, tl_version

__all__ = ["HookCache", "is_cache", "batched_cache", "describe_cache", "read_layer"]


@runtime_checkable
class HookCache(Protocol):
    """What the adapters read hooks from: an ``ActivationCache`` or a plain dict keyed by hook name."""

    def __getitem__(self, name: str) -> Tensor: ...

    def keys(self) -> Iterable[str]: ...


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
                              "model.run_with_cache(tokens, names_filter=tlg.capture.names_filter).")
    missing = [name for layer in range(layers[-1] + 1) for name in hook_names(layer) if name not in cache]
    if missing:
        raise TLGeometryError(f"the cache lacks {', '.join(missing[:4])}{' …' if len(missing) > 4 else ''}: the "
                              "analysis reads every layer; run model.run_with_cache(tokens, names_filter=tlg.capture.names_filter).")
    model = getattr(cache, "model", None)
    if model is not None and all(hasattr(model, name) for name in REQUIRED_ATTRIBUTES):
        info = describe_model(model)
        if info.n_layers == len(layers):
            return info
    pattern, v = cache[hook_names(0)[0]], cache[hook_names(0)[1]]
    if pattern.ndim != 4 or v.ndim != 4:
        raise TLGeometryError(f"cached hook_pattern {tuple(pattern.shape)} / hook_v {tuple(v.shape)}: expected "
                              "[batch, head, pos, pos] and [batch, pos, kv_head, d_head].")
    return ModelInfo(model_class="cache", n_layers=len(layers), n_heads=int(pattern.shape[1]),
                     n_kv_heads=int(v.shape[2]), d_head=int(v.shape[3]), model_name="unknown (a cache)",
                     transformer_lens_version=tl_version())


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
            "names_filter=tlg.capture.names_filter) for the layers you need."
        )
    pattern, v = cache[names[0]], cache[names[1]]
    return build_layer(layer, pattern, v, attention_mask, bos_flags(tokens, attention_mask, bos_token_id), window)


