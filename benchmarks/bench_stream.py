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

BATCH, SEQ = 8, 256
REPEATS = 5


def _tokens(model):
    import torch

    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(100, model.cfg.d_vocab - 100, (BATCH, SEQ), generator=gen)
    tokens[:, 0] = model.tokenizer.bos_token_id
    return tokens


def _variant(name: str, mode: str) -> dict:
    import torch

    from benchmarks.common import PeakRSS, median_time
    from tl_geometry import load_model, stream_layers

    torch.set_grad_enabled(False)
    model = load_model("smollm2-135m")
    tokens = _tokens(model)
    if name == "plain":
        def call():
            return model(tokens, return_type=None)
    else:
        def call():
            return stream_layers(model, tokens, lambda layer, att: None, stop_early=False)
    call()  # warm-up outside the measurement
    if mode == "memory":
        with PeakRSS() as mem:
            call()
        return {"peak_bytes": mem.peak}
    return {"seconds": median_time(call, repeats=REPEATS, warmup=0)}


def main() -> None:
    if len(sys.argv) > 1:  # child process: one variant
        print(json.dumps(_variant(sys.argv[1], sys.argv[2])))
        return
    from benchmarks.common import run_fresh

    rows = {
        name: {**run_fresh("benchmarks.bench_stream", name, "time"),
               **run_fresh("benchmarks.bench_stream", name, "memory", measure_memory=True)}
        for name in ("plain", "stream")
    }
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
