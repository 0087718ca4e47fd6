"""The random rankings' stream: counter-based, so a draw depends only on its coordinates.

A row's random ranking is a uniformly random ordered sample of its candidates (partial
Fisher–Yates), driven by splitmix64 keyed by (window and layer ``key``, head, query, repeat):
the same draws whatever the batching, sharding or backend (``tl_geometry.measure.layer_measures``
draws the same stream in torch on any device).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit

from .options import NO_RC
from .rows import first_visible

__all__ = ["GOLDEN", "MIX", "HEAD", "QUERY", "sample", "candidates", "random_top_orders"]

# splitmix64's increment and finaliser multipliers, and the multipliers that spread head and query.
GOLDEN = 0x9E3779B97F4A7C15
MIX = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
HEAD, QUERY = 0xD1B54A32D192ED03, 0xABC98388FB8FAC03
_GOLDEN = np.uint64(GOLDEN)
_MIX0, _MIX1 = np.uint64(MIX[0]), np.uint64(MIX[1])
_HEAD, _QUERY = np.uint64(HEAD), np.uint64(QUERY)


@njit(**NO_RC)
def _mix(z):
    """splitmix64's finaliser: a bijective scramble of 64 bits."""
    z = (z ^ (z >> np.uint64(30))) * _MIX0
    z = (z ^ (z >> np.uint64(27))) * _MIX1
    return z ^ (z >> np.uint64(31))


@njit(**NO_RC)
def sample(cand, n_cand, m, key, h, t, r, order):
    """``m`` of the ``n_cand`` candidates ``cand`` into ``order``, uniformly at random and in
    random order (``cand`` is permuted in place)."""
    state = _mix(key ^ _mix(np.uint64(h) * _HEAD + np.uint64(t) * _QUERY + np.uint64(r) + np.uint64(1)))
    for rank in range(m):
        state = state + _GOLDEN
        u = (_mix(state) >> np.uint64(11)) * (1.0 / 9007199254740992.0)  # 53 bits in [0, 1)
        j = rank + min(int(u * (n_cand - rank)), n_cand - rank - 1)
        chosen = cand[j]
        cand[j] = cand[rank]
        cand[rank] = chosen
        order[rank] = chosen


@njit(**NO_RC)
def candidates(key_mask, b, lo, t, exclude_sink, cand):
    """The candidate sources of query ``t`` (visible keys ``lo..t``) in increasing position into
    ``cand``; returns their number."""
    n_cand = 0
    for k in range(lo, t + 1):
        if key_mask[b, k] and not (exclude_sink and k == 0):
            cand[n_cand] = k
            n_cand += 1
    return n_cand


@njit(parallel=True, cache=True, nogil=True)
def random_top_orders(keys, key_mask, qpos, qvalid, exclude_sink, window, out):
    """The random rankings' best sources ``out[repeat, batch, head, q, :max_n]`` (left as the
    caller filled them past the candidates), exactly as the layer pass draws them (``window``:
    ``Rule.window``); one task per (sequence, head)."""
    n_heads, n_q, max_n = out.shape[2], qpos.shape[1], out.shape[4]
    for task in numba.prange(qpos.shape[0] * n_heads):
        b = task // n_heads
        h = task % n_heads
        cand = np.zeros(key_mask.shape[1], dtype=np.int64)
        order = np.zeros(max_n, dtype=np.int64)
        for qi in range(n_q):
            t = qpos[b, qi]
            if not qvalid[b, qi]:
                continue
            for r in range(out.shape[0]):
                n_cand = candidates(key_mask, b, first_visible(window, t), t, exclude_sink, cand)
                sample(cand, n_cand, min(max_n, n_cand), keys[b], h, t, r, order)
                for rank in range(min(max_n, n_cand)):
                    out[r, b, h, qi, rank] = order[rank]
