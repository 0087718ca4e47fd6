"""The random rankings in torch, on the tensors' device: the engine's counter-based stream.

A row's random ranking is a uniformly random ordered sample of its candidates (partial
Fisher–Yates) driven by splitmix64 keyed by (window and layer key, head, query, repeat), so
both backends draw the same rankings whatever the batching, sharding or device. 64-bit unsigned
arithmetic is done on int64 (two's complement: sums and products wrap alike; right shifts are
made logical by a mask).
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from .. import _engine as engine
from .selection import visible_sources

__all__ = ["random_top_orders"]


def _signed(value: int) -> int:
    """A 64-bit unsigned constant as the int64 with the same bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _signed(engine.GOLDEN)
_MIX = tuple(_signed(m) for m in engine.MIX)
_HEAD, _QUERY = _signed(engine.HEAD), _signed(engine.QUERY)


def _shift_right(z: Tensor, bits: int) -> Tensor:
    """Logical right shift of int64 bit patterns."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _mix(z: Tensor) -> Tensor:
    """splitmix64's finaliser."""
    z = (z ^ _shift_right(z, 30)) * _MIX[0]
    z = (z ^ _shift_right(z, 27)) * _MIX[1]
    return z ^ _shift_right(z, 31)


def random_top_orders(keys: Int[Tensor, " batch"], key_mask: Bool[Tensor, "batch key"], qpos: Int[Tensor, "batch q"],
                      qvalid: Bool[Tensor, "batch q"], n_heads: int, repeats: int, max_n: int,
                      exclude_sink: bool, window: int | None = None) -> Int[Tensor, "repeat batch head q max_n"]:
    """The best ``max_n`` sources of ``repeats`` random rankings of every chosen query (-1 past
    its candidates, and for pad queries), on ``key_mask``'s device; the candidates are the
    visible sources (``window``: the layer's sliding window)."""
    device = key_mask.device
    batch, n_q = qpos.shape
    n_k = key_mask.shape[1]
    positions = torch.arange(n_k, device=device)
    candidate = visible_sources(key_mask, qpos, window)  # [batch, q, key]
    if exclude_sink:
        candidate &= positions != 0
    n_cand = candidate.sum(-1)  # [batch, q]
    # the candidates in increasing position first (a stable sort of "not a candidate")
    cand = torch.sort((~candidate).to(torch.uint8), dim=-1, stable=True).indices
    shape = (repeats, batch, n_heads, n_q)
    cand = cand[None, :, None].expand(*shape, n_k).clone()
    n_cand = n_cand[None, :, None].expand(shape)
    h = torch.arange(n_heads, device=device)[None, None, :, None]
    r = torch.arange(repeats, device=device)[:, None, None, None]
    counter = h * _HEAD + qpos.to(device)[None, :, None, :] * _QUERY + r + 1
    state = _mix(keys.to(device)[None, :, None, None] ^ _mix(counter)).expand(shape).contiguous()
    out = torch.full((*shape, max_n), -1, dtype=torch.int64, device=device)
    live = qvalid.to(device)[None, :, None, :].expand(shape)
    for rank in range(min(max_n, n_k)):
        state = state + _GOLDEN
        u = _shift_right(_mix(state), 11).double() * (1.0 / 9007199254740992.0)  # 53 bits in [0, 1)
        left = (n_cand - rank).clamp_min(1)
        j = rank + torch.minimum((u * left).long(), left - 1)
        drawn = live & (rank < n_cand)
        chosen = cand.gather(-1, j[..., None])
        cand.scatter_(-1, j[..., None], cand[..., rank:rank + 1])
        cand[..., rank] = chosen[..., 0]
        out[..., rank] = torch.where(drawn, chosen[..., 0], -1)
    return out
