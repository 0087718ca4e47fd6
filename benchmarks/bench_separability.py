"""Cost of separability computed inside the streamed forward, and speed-up over the test oracle.

SmolLM2-135M, 8 x 256 tokens, N in {1,2,4,8,16,32}, Euclidean, attention ranking, no random
baseline. Each variant runs in a fresh process (see ``benchmarks/common.py`` for how memory is
measured). Prints a table and writes ``benchmarks/results/separability.json``.

    python -m benchmarks.bench_separability
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

NS = (1, 2, 4, 8, 16, 32)
REPEATS = 7


def _variants() -> dict:
    from tl_geometry import separability

    def on_layer(queries):
        return lambda layer, att: separability(att.pattern, att.kv_values, NS, queries=queries)

    return {"plain": None, "stream-last": on_layer("last"), "stream-all": on_layer("all")}


def _oracle_speedup() -> dict:
    """Fast vs loop oracle (tests/oracle.py) on an input the oracle finishes in seconds."""
    import torch

    from tests.oracle import oracle_separability
    from tl_geometry import separability

    gen = torch.Generator().manual_seed(0)
    batch, heads, kv, pos = 1, 3, 1, 128
    scores = torch.randn(batch, heads, pos, pos, generator=gen).masked_fill(
        ~torch.ones(pos, pos, dtype=torch.bool).tril(), -torch.inf)
    pattern, v = scores.softmax(-1), torch.randn(batch, pos, kv, 64, generator=gen)
    start = time.perf_counter()
    oracle_separability(pattern, v, NS)
    oracle = time.perf_counter() - start
    separability(pattern, v, NS)
    start = time.perf_counter()
    for _ in range(10):
        separability(pattern, v, NS)
    fast = (time.perf_counter() - start) / 10
    return {"oracle_seconds": oracle, "fast_seconds": fast, "speedup": oracle / fast, "shape": [batch, heads, pos, pos]}


def main() -> None:
    from benchmarks.common import collect_rows

    rows = collect_rows("benchmarks.bench_separability", _variants(), REPEATS, sys.argv[1:])
    if rows is None:
        return
    plain = rows["plain"]
    ratios = {
        f"{name}_{kind}_ratio": rows[name][key] / plain[key]
        for name in ("stream-last", "stream-all") for kind, key in (("time", "seconds"), ("memory", "peak_bytes"))
    }
    oracle = _oracle_speedup()
    print("SmolLM2-135M, 8x256 tokens, N=1..32, Euclidean, attention ranking, CPU (2 cores)")
    print(f"{'variant':12s} {'time (s)':>9s} {'peak (MiB)':>11s}")
    for name, row in rows.items():
        print(f"{name:12s} {row['seconds']:9.2f} {row['peak_bytes'] / 2**20:11.1f}")
    for key, value in ratios.items():
        print(f"{key:28s} {value:.3f}")
    print(f"oracle speed-up on {oracle['shape']}: {oracle['speedup']:.0f}x "
          f"({oracle['oracle_seconds']:.2f}s vs {oracle['fast_seconds'] * 1e3:.1f}ms)")
    out = Path(__file__).parent / "results" / "separability.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"rows": rows, **ratios, "oracle": oracle}, indent=1))


if __name__ == "__main__":
    main()
