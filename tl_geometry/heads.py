"""Heads and layers by name: ``L{layer}H{head}``, the ``[n_layers, n_heads]`` grid every per-head
table starts from (layer-major: row ``layer·n_heads + head``, TransformerLens's flat index), and
the parsing of heads given in any of TransformerLens's conventions."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, SupportsIndex

import einops
import numpy as np
import torch
from torch import Tensor

from .errors import TLGeometryError

__all__ = ["head_name", "head_columns", "head_names", "layer_spans", "parse_heads", "parse_head", "kv_to_query_heads"]


def head_name(layer: SupportsIndex, head: SupportsIndex) -> str:
    """The name of a head in every table and plot: ``L{layer}H{head}``."""
    return f"L{int(layer)}H{int(head)}"


def head_columns(n_layers: int, n_heads: int) -> dict[str, Any]:
    """The first columns of every per-head table: ``layer``, ``head`` (int64) and ``name``, one row
    per head in layer-major order.

    >>> head_columns(2, 2)["name"]
    ['L0H0', 'L0H1', 'L1H0', 'L1H1']
    """
    layer, head = np.divmod(np.arange(n_layers * n_heads, dtype=np.int64), n_heads)
    return {"layer": layer, "head": head, "name": [head_name(a, b) for a, b in zip(layer, head, strict=True)]}


def kv_to_query_heads(values: Tensor, n_heads: int) -> Tensor:
    """A ``[n_layers, n_kv_heads]`` tensor (one value per kv head, GQA/MQA) on the query heads:
    query head ``h`` reads kv head ``h // (n_heads // n_kv_heads)``, the model's own grouping."""
    return einops.repeat(values, "layer kv -> layer (kv group)", group=n_heads // values.shape[1])


def head_names(n_layers: int, n_heads: int) -> list[list[str]]:
    """Every head's name as a ``[n_layers][n_heads]`` grid (the hover text of a head map)."""
    return [[head_name(layer, head) for head in range(n_heads)] for layer in range(n_layers)]


def layer_spans(layers: list[int]) -> str:
    """Layers as runs: ``[0, 1, 2, 4]`` as ``"layers 0–2, 4"``.

    >>> layer_spans([0, 1, 2, 4]), layer_spans([7])
    ('layers 0–2, 4', 'layer 7')
    """
    spans: list[list[int]] = []
    for layer in sorted(layers):
        if spans and layer == spans[-1][1] + 1:
            spans[-1][1] = layer
        else:
            spans.append([layer, layer])
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in spans)


_HEAD_NAME = re.compile(r"L(\d+)H(\d+)")
_HEADS_HELP = ("heads are (layer, head) pairs, 'L3H4' names, flat indices layer·n_heads + head (a list or an "
               "integer tensor, as topk over a [n_layers, n_heads] tensor gives) or a boolean [n_layers, n_heads] mask")


def _integer(x: Any) -> int | None:
    if isinstance(x, bool) or (isinstance(x, torch.Tensor) and (x.numel() != 1 or x.is_floating_point()
                                                                  or x.dtype == torch.bool)):
        return None
    return int(x) if hasattr(x, "__index__") else None


def parse_heads(heads: Any, n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """Heads in TransformerLens's conventions as ``(layer, head)`` pairs, checked against the model's
    ``n_layers × n_heads``: a pair, an ``"L3H4"`` name or a flat index each (in a list), an integer
    tensor of flat indices or of pairs ``[k, 2]``, a boolean ``[n_layers, n_heads]`` mask, or one
    name or flat index alone. A bare tuple of two integers is refused (one head, or two flat
    indices?): write ``[(3, 4)]`` or ``[3, 4]``.

    >>> parse_heads(["L1H2", (0, 1), 5], n_layers=2, n_heads=4)
    [(1, 2), (0, 1), (1, 1)]
    """
    if isinstance(heads, torch.Tensor):
        if heads.dtype == torch.bool:
            if tuple(heads.shape) != (n_layers, n_heads):
                raise TLGeometryError(f"a boolean head mask must be [n_layers, n_heads] = [{n_layers}, {n_heads}]; "
                                      f"got {list(heads.shape)}.")
            return [(int(layer), int(head)) for layer, head in heads.nonzero().tolist()]
        if heads.is_floating_point() or heads.ndim > 2 or (heads.ndim == 2 and heads.shape[1] != 2):
            raise TLGeometryError(f"{_HEADS_HELP}; got a {heads.dtype} tensor of shape {list(heads.shape)}.")
        heads = heads.tolist() if heads.ndim else [int(heads)]
    elif isinstance(heads, str) or _integer(heads) is not None:
        heads = [heads]
    elif isinstance(heads, tuple) and len(heads) == 2 and all(_integer(x) is not None for x in heads):
        raise TLGeometryError(f"heads={heads!r} is ambiguous: write [{heads!r}] for head L{heads[0]}H{heads[1]}, or "
                              f"[{heads[0]}, {heads[1]}] for two flat indices.")
    if isinstance(heads, bytes) or not isinstance(heads, Iterable):
        raise TLGeometryError(f"{_HEADS_HELP}; got {heads!r}.")
    return [_one_head(item, n_layers, n_heads) for item in heads]


def parse_head(head: Any, n_layers: int, n_heads: int) -> tuple[int, int]:
    """One head as ``(layer, head)``: a pair, an ``"L3H4"`` name or a flat index (or a list or
    tensor that holds exactly one of them)."""
    if isinstance(head, tuple) and len(head) == 2:
        head = [head]  # one pair, not two flat indices: a single head was asked for
    heads = parse_heads(head, n_layers, n_heads)
    if len(heads) != 1:
        raise TLGeometryError(f"one head is asked for here (a (layer, head) pair, 'L3H4' or a flat index); got "
                              f"{len(heads)}: {head!r}.")
    return heads[0]


def _one_head(item: Any, n_layers: int, n_heads: int) -> tuple[int, int]:
    match = _HEAD_NAME.fullmatch(item) if isinstance(item, str) else None
    flat = _integer(item)
    if match is not None:
        pair = int(match[1]), int(match[2])
    elif flat is not None:
        if not 0 <= flat < n_layers * n_heads:
            raise TLGeometryError(f"flat head index {flat} is out of range for {n_layers} layers × {n_heads} heads.")
        pair = divmod(flat, n_heads)
    elif isinstance(item, tuple | list | torch.Tensor) and len(item) == 2 and None not in map(_integer, item):
        pair = int(item[0]), int(item[1])
    else:
        raise TLGeometryError(f"{_HEADS_HELP}; got {item!r}.")
    if not (0 <= pair[0] < n_layers and 0 <= pair[1] < n_heads):
        raise TLGeometryError(f"head {pair} is out of range for {n_layers} layers × {n_heads} heads.")
    return pair
