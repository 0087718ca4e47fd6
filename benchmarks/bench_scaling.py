"""Scaling of the full analysis (``tlg.analyze``: separability with 16 random rankings, sink
diagnostics, regime bounds, taxonomy votes; last query) with sequence length and window count.

SmolLM2-135M on random tokens (BOS first). Sequence length doubles 128 → 1024 at 4 windows;
windows double 4 → 32 at 256 tokens. Times come from one process (each configuration once after
a warm-up); peak memory from one fresh process per configuration (see ``benchmarks/common.py``).
The exponent is the least-squares slope of log(time) against log(size).

    python -m benchmarks.bench_scaling
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

LENGTHS = (128, 256, 512, 1024)
WINDOWS = (4, 8, 16, 32)


def _tokens(model, windows: int, length: int):
    import torch

    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(100, model.cfg.d_vocab - 100, (windows, length), generator=gen)
    tokens[:, 0] = model.tokenizer.bos_token_id
    return tokens


def _run(model, windows: int, length: int) -> float:
    import tl_geometry as tlg

    start = time.perf_counter()
    tlg.analyze(model, _tokens(model, windows, length), progress=False, bootstrap=100, batch_size=4)
    return time.perf_counter() - start


def _slope(xs, ys) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum((a - mx) ** 2 for a in lx)


def main() -> None:
    import torch

    from benchmarks.common import PeakRSS, run_fresh
    from tl_geometry import load_model

    torch.set_grad_enabled(False)
    if sys.argv[1:2] == ["memory"]:  # child: one configuration
        windows, length = int(sys.argv[2]), int(sys.argv[3])
        model = load_model("smollm2-135m")
        with PeakRSS() as mem:
            _run(model, windows, length)
        print(json.dumps({"peak_bytes": mem.peak}))
        return
    model = load_model("smollm2-135m")
    _run(model, 4, 128)  # warm-up
    configs = [(4, n) for n in LENGTHS] + [(w, 256) for w in WINDOWS if w != 4]
    seconds = {c: _run(model, *c) for c in configs}
    peaks = {c: run_fresh("benchmarks.bench_scaling", "memory", str(c[0]), str(c[1]), measure_memory=True)["peak_bytes"]
             for c in configs}
    by_length = [(n, seconds[(4, n)], peaks[(4, n)]) for n in LENGTHS]
    by_windows = [(w, seconds[(w, 256)], peaks[(w, 256)]) for w in WINDOWS]
    result = {
        "by_length": by_length, "by_windows": by_windows,
        "time_exponent_length": _slope(LENGTHS, [t for _, t, _ in by_length]),
        "memory_exponent_length": _slope(LENGTHS, [m for _, _, m in by_length]),
        "time_exponent_windows": _slope(WINDOWS, [t for _, t, _ in by_windows]),
        "memory_exponent_windows": _slope(WINDOWS, [m for _, _, m in by_windows]),
    }
    print("SmolLM2-135M, tlg.analyze (last query, 16 random rankings, sink + regime + taxonomy), CPU (2 cores)")
    print(f"{'windows':>8s} {'length':>7s} {'time (s)':>9s} {'peak (MiB)':>11s}")
    for (w, n), t in seconds.items():
        print(f"{w:8d} {n:7d} {t:9.2f} {peaks[(w, n)] / 2**20:11.1f}")
    for key in ("time_exponent_length", "memory_exponent_length", "time_exponent_windows", "memory_exponent_windows"):
        print(f"{key:26s} {result[key]:.2f}")
    out = Path(__file__).parent / "results" / "scaling.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
