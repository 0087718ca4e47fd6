"""The floating-point environment of the threads the kernels and torch's CPU operations run on.

The certificates' rounding model assumes gradual underflow (docs/theory.md, Lemma 3 step 4).
Flush-to-zero or denormals-are-zero (``torch.set_flush_denormal(True)``, or a library built with
fast-math that sets them when loaded) is a per-thread setting: the calling thread's is read by a
numpy product at every call, and the pool's (numba's workers are torch's OpenMP team) once per
process, by a parallel kernel with iterations for every thread.
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


# Whether the pool's threads flush: read once per process (their setting changes only by code run
# on them, and a parallel region per call would wake the pool and leave it spinning beside torch).
_pool: list[bool] = []


def flushes_subnormals() -> bool:
    """Whether the calling thread (read at every call: ``torch.set_flush_denormal`` sets it) or any
    of the pool's threads (read once) flushes subnormal results to zero, or reads subnormal
    operands as zero."""
    tiny = np.full(1, np.finfo(np.float64).tiny)
    if (tiny * 0.5)[0] == 0.0 or (np.full(1, 5e-324) * 1.0)[0] == 0.0:
        return True
    if not _pool:
        threads = numba.config.NUMBA_NUM_THREADS * _PER_THREAD
        out = np.ones(threads)
        with team(threads * (1 << 17)):  # every pool thread, whatever the job's size
            _pool_flushes(np.full(threads, np.finfo(np.float64).tiny), out)
        _pool.append(bool((out == 0.0).any()))
    return _pool[0]
