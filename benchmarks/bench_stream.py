"""Cost of streaming attention through hooks: ``stream_layers`` vs a plain forward.

SmolLM2-135M, all 30 layers, 8 x 256 tokens, on this machine's CPU. The hooks do no work
(``fn`` is a no-op), so the ratios measure the adapter itself: float32 copies, GQA alignment
and masks. Prints a table and writes ``benchmarks/results/stream.json``.

    python -m benchmarks.bench_stream            # from the repository root
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPEATS = 5


VARIANTS = {"plain": None, "stream": lambda layer, att: None}


def main() -> None:
    from benchmarks.common import BATCH, SEQ, collect_rows

    rows = collect_rows("benchmarks.bench_stream", VARIANTS, REPEATS, sys.argv[1:])
    if rows is None:
        return
    ratios = {
        "time_ratio": rows["stream"]["seconds"] / rows["plain"]["seconds"],
        "memory_ratio": rows["stream"]["peak_bytes"] / rows["plain"]["peak_bytes"],
    }
    print(f"SmolLM2-135M, {BATCH}x{SEQ} tokens, 30 layers, CPU")
    print(f"{'variant':10s} {'time (s)':>9s} {'peak (MiB)':>11s}")
    for name, row in rows.items():
        print(f"{name:10s} {row['seconds']:9.3f} {row['peak_bytes'] / 2**20:11.1f}")
    print(f"time ratio {ratios['time_ratio']:.3f} (target <= 1.1), memory ratio {ratios['memory_ratio']:.3f} (target <= 1.2)")
    out = Path(__file__).parent / "results" / "stream.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"rows": rows, **ratios}, indent=1))


if __name__ == "__main__":
    main()
