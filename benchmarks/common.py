"""Shared benchmark helpers: fresh-process runs, RSS sampling and median timing.

Memory on the CPU is measured as the peak resident set size above the baseline taken just
before the measured call, sampled every 0.2 ms by a thread. Each variant runs in a fresh
process with glibc told to mmap every block over 64 KiB (``MALLOC_MMAP_THRESHOLD_``), so a freed
tensor leaves the RSS at once and the samples follow live memory rather than allocator caches.
That setting slows allocation, so times are measured in other processes with the default allocator.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


class PeakRSS:
    """Context manager: ``.peak`` = highest RSS above the entry baseline, in bytes."""

    def __enter__(self):
        self.base = rss_bytes()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes() - self.base)
            time.sleep(0.0002)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes() - self.base)


def median_time(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_fresh(module: str, *args: str, measure_memory: bool = False) -> dict:
    """Run ``python -m module args`` in a fresh process; it prints one JSON line last.

    Memory runs set the glibc mmap threshold (accurate RSS, slower allocation); timing runs keep
    the default allocator, so the two are measured in separate processes."""
    env = dict(os.environ)
    if measure_memory:
        env.update(MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    out = subprocess.run(
        [sys.executable, "-m", module, *args], env=env, check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(call: Callable[[], object], mode: str, repeats: int) -> dict:
    """One warm-up, then peak RSS of one call (``mode="memory"``) or the median of ``repeats``."""
    call()
    if mode == "memory":
        with PeakRSS() as mem:
            call()
        return {"peak_bytes": mem.peak}
    return {"seconds": median_time(call, repeats=repeats, warmup=0)}


BATCH, SEQ = 8, 256


def smollm2_batch():
    """SmolLM2-135M and a fixed batch of BATCH x SEQ random tokens (BOS first), no autograd."""
    import torch

    from tl_geometry import load_model

    torch.set_grad_enabled(False)
    model = load_model("smollm2-135m")
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(100, model.cfg.d_vocab - 100, (BATCH, SEQ), generator=gen)
    tokens[:, 0] = model.tokenizer.bos_token_id
    return model, tokens


def plain_or_streamed(name: str, mode: str, repeats: int, on_layer) -> dict:
    """Measure a plain forward (``name == "plain"``) or ``stream_layers`` calling ``on_layer``."""
    from tl_geometry import stream_layers

    model, tokens = smollm2_batch()
    if name == "plain":
        def call():
            return model(tokens, return_type=None)
    else:
        def call():
            return stream_layers(model, tokens, on_layer, stop_early=False)
    return measure(call, mode, repeats)
