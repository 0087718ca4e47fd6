"""The floating-point environment of the threads the kernels and torch's CPU operations run on.

The certificates' rounding model assumes gradual underflow (docs/theory.md, Lemma 3 step 4).
Flush-to-zero or denormals-are-zero (``torch.set_flush_denormal(True)``, or a library built with
fast-math that sets them when loaded) is a per-thread setting: the calling thread's is read by a
numpy product, and the pool's (numba's workers are torch's OpenMP team) by a parallel kernel with
an iteration on every thread.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit

from .threads import team

__all__ = ["flushes_subnormals"]

# Iterations per pool thread of the probe: dynamic scheduling hands each thread at least one.
_PER_THREAD = 4


@njit(parallel=True, cache=True, nogil=True)
def _pool_flushes(tiny, out):
    """``out[i] = tiny[i] · 0.5`` on every pool thread (a subnormal result: 0 where it is flushed)."""
    for i in numba.prange(out.shape[0]):
        out[i] = tiny[i] * 0.5


def flushes_subnormals() -> bool:
    """Whether the calling thread or any of the pool's threads flushes subnormal results to zero
    (or reads subnormal operands as zero)."""
    tiny = np.full(1, np.finfo(np.float64).tiny)
    if (tiny * 0.5)[0] == 0.0 or (np.full(1, 5e-324) * 1.0)[0] == 0.0:
        return True
    threads = numba.config.NUMBA_NUM_THREADS * _PER_THREAD
    tiny = np.full(threads, np.finfo(np.float64).tiny)
    out = np.ones(threads)
    with team(threads * (1 << 17)):  # every pool thread, whatever the job's size
        _pool_flushes(tiny, out)
    return bool((out == 0.0).any())
