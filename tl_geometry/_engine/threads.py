"""Parallel work: a kernel's tasks in chunks, run on a pool of Python threads.

Each compiled kernel takes a task range ``(lo, hi)`` and releases the GIL (``nogil``), so plain
threads run chunks of tasks side by side. Chunks are handed out as threads free up (several per
thread), so a thread slowed by a busy core does not hold up the others, and no second OpenMP
runtime sits beside torch's: nothing spins while torch works, and nothing is configured at
import. Threads follow ``torch.get_num_threads()`` (one per rank under ``torchrun``); jobs of
fewer than ``PARALLEL_ELEMENTS`` row elements run in the caller's thread (waking a pool costs
more than they do).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise

import torch

__all__ = ["run_tasks", "PARALLEL_ELEMENTS", "CHUNKS_PER_THREAD"]

# Row elements (rows × keys) below which a kernel runs in the caller's thread.
PARALLEL_ELEMENTS = 1 << 17
# Chunks per thread: enough for a fast thread to take over a slow one's share.
CHUNKS_PER_THREAD = 4

_pools: dict[tuple[int, int], ThreadPoolExecutor] = {}


def _pool(threads: int) -> ThreadPoolExecutor:
    """This process' pool of ``threads`` threads, made on first use (a forked child makes its own)."""
    key = (os.getpid(), threads)
    if key not in _pools:
        _pools[key] = ThreadPoolExecutor(threads, thread_name_prefix="tl_geometry")
    return _pools[key]


def run_tasks(kernel, n_tasks: int, elements: int, *args) -> None:
    """``kernel(lo, hi, *args)`` over the tasks ``0..n_tasks-1``, in chunks on torch's thread count."""
    threads = 1 if elements < PARALLEL_ELEMENTS else min(torch.get_num_threads(), n_tasks)
    if threads <= 1:
        kernel(0, n_tasks, *args)
        return
    n_chunks = min(n_tasks, threads * CHUNKS_PER_THREAD)
    bounds = [n_tasks * i // n_chunks for i in range(n_chunks + 1)]
    futures = [_pool(threads).submit(kernel, lo, hi, *args) for lo, hi in pairwise(bounds)]
    for future in futures:
        future.result()
