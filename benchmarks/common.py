"""Shared benchmark helpers: fresh-process runs, RSS sampling and median timing.

Memory on the CPU is measured as the peak resident set size above the baseline taken just
before the measured call, sampled every 0.2 ms by a thread. Each variant runs in a fresh
process with glibc told to mmap every block over 64 KiB (``MALLOC_MMAP_THRESHOLD_``), so a freed
tensor leaves the RSS at once and the samples follow live memory rather than allocator caches.
That setting slows allocation, so times are measured in another process with the default
allocator, all variants interleaved round by round (the machine's speed drifts).
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


def _calls(variants: dict) -> dict[str, Callable[[], object]]:
    """One call per variant on the shared model: None is the plain forward, else the layer callback."""
    from tl_geometry.capture import stream_layers

    model, tokens = smollm2_batch()

    def make(on_layer):
        if on_layer is None:
            return lambda: model(tokens, return_type=None)
        return lambda: stream_layers(model, tokens, on_layer, stop_early=False)

    return {name: make(on_layer) for name, on_layer in variants.items()}


def collect_rows(module: str, variants: dict, repeats: int, argv: list[str]) -> dict | None:
    """Benchmark rows ``{variant: {"seconds", "peak_bytes"}}``, or act as the child process.

    Times: one process runs all variants interleaved, round after round, and keeps each
    variant's median, so drift of the machine's speed hits every variant alike. Memory: one
    fresh process per variant (allocator set for RSS accuracy, see the module docstring).
    """
    if argv:  # child: "time" or "memory NAME"
        calls = _calls(variants if argv[0] == "time" else {argv[1]: variants[argv[1]]})
        for call in calls.values():
            call()  # warm-up
        if argv[0] == "memory":
            with PeakRSS() as mem:
                next(iter(calls.values()))()
            print(json.dumps({"peak_bytes": mem.peak}))
            return None
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(repeats):
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
        print(json.dumps({name: statistics.median(values) for name, values in times.items()}))
        return None
    seconds = run_fresh(module, "time")
    return {
        name: {"seconds": seconds[name], **run_fresh(module, "memory", name, measure_memory=True)}
        for name in variants
    }
