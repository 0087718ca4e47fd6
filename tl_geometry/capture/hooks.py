"""Hook plumbing for interventions: attach and remove forward hooks on any TransformerLens model
class, and the hook lists that override a layer's attention pattern or redirect heads to the sink.

The other model-class differences (reading hooks, weights, the loss) stay in ``adapters``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from ..errors import TLGeometryError
from .adapters import hook_names

__all__ = ["z_hook_name", "add_hooks", "remove_hooks", "foreign_hooks", "warn_hooks_left", "pattern_override_hooks",
           "sink_redirect_hooks", "window_hooks"]

# The handles tl_geometry attached and has not removed yet (ids of TransformerLens LensHandles):
# its own ablation contexts are deliberate, not leftovers.
_OWN: set[int] = set()


def z_hook_name(layer: int) -> str:
    """Hook of the per-head attention output before ``W_O``, ``[batch, pos, head, d_head]``."""
    return f"blocks.{layer}.attn.hook_z"


def add_hooks(model: Any, fwd_hooks: Iterable[tuple[str, Callable]]) -> list[tuple[Any, Any]]:
    """Attach forward hooks and return handles that remove exactly these hooks (and no hook of
    the user's), on every model class: ``[(hook_point, handle), ...]``."""
    handles = []
    for name, fn in fwd_hooks:
        if name not in model.hook_dict:
            raise TLGeometryError(f"model has no hook point {name!r}: check the hook name (e.g. blocks.0.attn.hook_z)")
        point = model.hook_dict[name]
        point.add_hook(fn)
        handles.append((point, point.fwd_hooks[-1]))  # TransformerLens 2.x/3.x add_hook returns None
        _OWN.add(id(point.fwd_hooks[-1]))
    return handles


def remove_hooks(handles: list[tuple[Any, Any]]) -> None:
    """Remove hooks added by :func:`add_hooks`."""
    for point, handle in handles:
        handle.hook.remove()
        _OWN.discard(id(handle))
        if handle in point.fwd_hooks:
            point.fwd_hooks.remove(handle)


def foreign_hooks(model: Any) -> list[str]:
    """The hook points that carry hooks left attached outside any context (``model.add_hook``
    without removal): not TransformerLens's ``model.hooks(...)`` / ``run_with_hooks`` contexts
    (their hooks carry a context level), not permanent hooks (part of the model as configured),
    not tl_geometry's own ablations."""
    names, seen = [], set()
    for name, point in getattr(model, "hook_dict", {}).items():
        if id(point) in seen:  # one hook point under several names (the bridge's aliases)
            continue
        seen.add(id(point))
        handles = [*getattr(point, "fwd_hooks", ()), *getattr(point, "bwd_hooks", ())]
        if any(getattr(h, "context_level", None) is None and not getattr(h, "is_permanent", False)
               and id(h) not in _OWN for h in handles):
            names.append(name)
    return names


def warn_hooks_left(model: Any, allow_hooks: bool, stacklevel: int = 3) -> None:
    """Warn when hooks left attached (:func:`foreign_hooks`) would change what is measured."""
    left = [] if allow_hooks else foreign_hooks(model)
    if left:
        shown = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
        warnings.warn(f"the model has hooks attached at {shown}: what is measured is the hooked model. Remove "
                      "them with model.reset_hooks(), or pass allow_hooks=True to measure it so.",
                      stacklevel=stacklevel + 1)


def pattern_override_hooks(layer: int, fn: Callable[[Tensor], Tensor]) -> list[tuple[str, Callable]]:
    """Hooks that replace one layer's attention pattern by ``fn(pattern)`` *and* make the head
    outputs follow it.

    ``hook_z`` is recomputed as ``pattern' @ v`` from the layer's ``hook_v`` (kv heads aligned to
    query heads), so the override does not depend on whether the model consumes the hooked
    pattern. The 3.x TransformerBridge fires ``hook_pattern`` only after the head outputs (it
    reports the pattern, it does not use it); there the hooks raise a clear error.
    """
    return _row_override_hooks(layer, None, fn, "an attention pattern cannot be overridden")


def _row_override_hooks(layer: int, heads: list[int] | None, fn: Callable[[Tensor], Tensor],
                        refused: str) -> list[tuple[str, Callable]]:
    """Hooks that replace the attention rows of query ``heads`` of ``layer`` (every head: None) by
    ``fn(rows)`` ``[batch, heads, query, key]`` and recompute those heads' ``hook_z`` from
    ``hook_v``; where ``hook_z`` fires before ``hook_pattern`` they raise, saying ``refused``."""
    pattern_name, v_name = hook_names(layer)
    index = None if heads is None else torch.tensor(heads)
    state: dict[str, Tensor] = {}

    def keep_v(v: Tensor, hook=None) -> None:
        state["v"] = v

    def override(pattern: Tensor, hook=None) -> Tensor:
        if index is None:
            state["rows"] = fn(pattern)
            return state["rows"]
        state["rows"] = fn(pattern[:, index])
        pattern = pattern.clone()
        pattern[:, index] = state["rows"].to(pattern.dtype)
        return pattern

    def recompute_z(z: Tensor, hook=None) -> Tensor:
        if "rows" not in state:
            raise TLGeometryError(
                f"this model computes the head outputs (hook_z) before it reports hook_pattern (the TransformerLens "
                f"3.x TransformerBridge), so {refused}; use TransformerLens 4.x or a HookedTransformer."
            )
        rows, v = state.pop("rows"), state.pop("v")
        v = v.repeat_interleave(z.shape[2] // v.shape[2], 2)  # [batch, key, head, d_head]
        if index is None:
            return torch.einsum("bhqk,bkhd->bqhd", rows.to(v.dtype), v).to(z.dtype)
        z = z.clone()
        z[:, :, index] = torch.einsum("bhqk,bkhd->bqhd", rows.to(v.dtype), v[:, :, index]).to(z.dtype)
        return z

    return [(v_name, keep_v), (pattern_name, override), (z_hook_name(layer), recompute_z)]


def sink_redirect_hooks(layer: int, heads: list[int]) -> list[tuple[str, Callable]]:
    """Hooks that redirect the attention of query ``heads`` of ``layer`` entirely to position 0.

    The head output becomes ``v_0`` of the kv head it reads (set at ``hook_z`` from ``hook_v``,
    exact on every model class) and ``hook_pattern`` shows the one-hot row to later observers.
    """
    pattern_name, v_name = hook_names(layer)
    index = torch.tensor(heads)
    state: dict[str, Tensor] = {}

    def keep_v(v: Tensor, hook=None) -> None:
        state["v0"] = v[:, :1]

    def one_hot(pattern: Tensor, hook=None) -> Tensor:
        pattern = pattern.clone()
        pattern[:, index] = 0
        pattern[:, index, :, 0] = 1
        return pattern

    def to_v0(z: Tensor, hook=None) -> Tensor:
        v0 = state["v0"].repeat_interleave(z.shape[2] // state["v0"].shape[2], 2)  # [batch, 1, head, d_head]
        z = z.clone()
        z[:, :, index] = v0[:, :, index].to(z.dtype)
        return z

    return [(v_name, keep_v), (z_hook_name(layer), to_v0), (pattern_name, one_hot)]


def window_hooks(layer: int, heads: list[int], window: int, sink: int) -> list[tuple[str, Callable]]:
    """Hooks that restrict query ``heads`` of ``layer`` to StreamingLLM-style attention: the first
    ``sink`` positions and the last ``window`` positions up to and including the query, the
    weights renormalised over them, which is exactly softmax attention with the other keys'
    scores masked. The heads' ``hook_z`` is recomputed from ``hook_v`` (exact on every model
    class that reports ``hook_pattern`` before its head outputs; a clear error otherwise) and
    ``hook_pattern`` shows the restricted rows to later observers."""

    def restrict(rows: Tensor) -> Tensor:
        n_q, n_k = rows.shape[-2:]
        query = torch.arange(n_k - n_q, n_k, device=rows.device)[:, None]
        key = torch.arange(n_k, device=rows.device)[None, :]
        rows = rows * ((key < sink) | (key > query - window))
        return rows / rows.sum(-1, keepdim=True)

    return _row_override_hooks(layer, heads, restrict, "attention cannot be restricted to a window")
