"""Statistics of a layer's value vectors: float64 squared norms, the sink's products, correctly
rounded norms, and |cos| over non-sink pairs from the Gram matrices."""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit

from .metrics import dot

__all__ = ["squared_norms", "sink_products", "norms_from_squares", "pair_cosine_statistics"]


@njit(cache=True, nogil=True)
def _products(values, with_sink):
    """``v_k · v_k`` (or ``v_k · v_0``) in float64 for every key of ``[batch, kv, key, d]`` values,
    without a float64 copy: products of float32 entries widened to float64 are exact, so the
    result is a float64 reduction of exact products (docs/theory.md, Lemma 3 step 2)."""
    n_batch, n_kv, n_k, _ = values.shape
    out = np.empty((n_batch, n_kv, n_k))
    for b in range(n_batch):
        for h in range(n_kv):
            for k in range(n_k):
                out[b, h, k] = dot(values, b, h, k, values[b, h, 0] if with_sink else values[b, h, k])
    return out


@njit(cache=True, nogil=True)
def squared_norms(values):
    """``‖v‖²`` in float64 over the last axis of ``[batch, kv, key, d]`` values."""
    return _products(values, False)


@njit(cache=True, nogil=True)
def sink_products(values):
    """``⟨v_0, v_k⟩`` in float64 for every key: the sink's Gram row, which the certificates bound."""
    return _products(values, True)


@njit(cache=True, nogil=True)
def norms_from_squares(squares):
    """``sqrt`` of float64 squared norms, correctly rounded (IEEE square root)."""
    out = np.empty_like(squares)
    flat_in, flat_out = squares.reshape(-1), out.reshape(-1)
    for i in range(flat_in.shape[0]):
        flat_out[i] = math.sqrt(flat_in[i])
    return out


@njit(parallel=True, cache=True, nogil=True, fastmath={"nnan", "ninf", "nsz", "reassoc"})
def pair_cosine_statistics(gram, norms, nonsink, bits_like, newest, largest, total):
    """|cos| of every pair of non-sink keys from the Gram matrices ``[batch, kv, key, key]``,
    without holding the cosine matrix: ``newest[b, kv, t] = max_{i<t} |cos(v_t, v_i)|`` (0 without
    such a pair), and per (sequence, kv head) the largest and the sum over ordered pairs i ≠ j.
    Cosines are ``G[t, i]·(1/‖v_t‖)·(1/‖v_i‖)`` in the values' dtype (norms clamped to the
    dtype's tiny; non-sink keys get the reciprocal 0, so the loops need no branch); inputs are
    finite. A row's |cos| are ≥ 0, so their maximum is an integer maximum of their bit patterns
    (``bits_like``: an empty integer array of the values' width), which LLVM vectorises."""
    n_batch, n_kv, n_k, _ = gram.shape
    tiny = np.finfo(norms.dtype).tiny
    for task in numba.prange(n_batch * n_kv):
        b = task // n_kv
        h = task % n_kv
        inverse = np.zeros(n_k, dtype=norms.dtype)
        row_bits = np.zeros(n_k, dtype=bits_like.dtype)
        row = row_bits.view(norms.dtype)
        top_bits = np.zeros(1, dtype=bits_like.dtype)
        top_value = top_bits.view(norms.dtype)  # the maximum's bits read back as a float
        for k in range(n_k):
            if nonsink[b, k]:
                inverse[k] = 1 / max(norms[b, h, k], tiny)
        best = 0.0
        summed = 0.0
        for t in range(n_k):
            scale = inverse[t]
            row_sum = 0.0
            for i in range(t):  # indexed, not a row view (a view is reference-counted)
                c = abs(gram[b, h, t, i]) * scale * inverse[i]
                row[i] = c
                row_sum += c
            top = 0  # the bits of +0.0: the maximum without pairs
            for i in range(t):
                top = max(top, row_bits[i])
            top_bits[0] = top
            newest[b, h, t] = top_value[0]
            best = max(best, float(top_value[0]))
            summed += 2.0 * row_sum
        largest[b, h] = best
        total[b, h] = summed
