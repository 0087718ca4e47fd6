"""numba's thread pool: sized on first use, and each parallel kernel's team set and restored.

The pool runs on the OpenMP runtime torch has loaded (one ``libgomp`` in the process), so a
kernel's parallel loop and torch's operations share one team of warm threads. numba launches the
pool at the first parallel kernel with ``numba.config.NUMBA_NUM_THREADS`` threads; unless the
user set the ``NUMBA_NUM_THREADS`` variable, that value is made torch's thread count just before
(a config value, not the process environment): ranks under ``torchrun`` have one thread each, and
a pool of idle workers per rank would spin against the other ranks. Small jobs run on one thread
(waking the pool costs more). Loop iterations are handed out one at a time (dynamic
scheduling), so a thread slowed by a busy core does not hold up the others.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import numba
import torch

__all__ = ["team", "PARALLEL_ELEMENTS"]

# Row elements (rows × keys) below which a kernel runs on one thread.
PARALLEL_ELEMENTS = 1 << 17


def _size_pool() -> None:
    """Before numba launches its pool: size it to torch's threads, unless the user chose."""
    from numba.np.ufunc import parallel

    if not parallel._is_initialized and "NUMBA_NUM_THREADS" not in os.environ:
        numba.config.NUMBA_NUM_THREADS = max(1, torch.get_num_threads())


@contextmanager
def team(elements: int) -> Iterator[None]:
    """Run the parallel kernels inside on torch's thread count (one below ``PARALLEL_ELEMENTS``
    row elements; at most the pool's size), dynamically scheduled; the caller's settings restored."""
    _size_pool()
    threads = 1 if elements < PARALLEL_ELEMENTS else torch.get_num_threads()
    previous = numba.get_num_threads()
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    try:
        with numba.parallel_chunksize(1):
            yield
    finally:
        numba.set_num_threads(previous)
