"""Throughput of ``tlg.analyze`` sharded over 2 processes (torchrun, gloo) against 1 process.

SmolLM2-135M, 8 windows × 256 tokens (random tokens, BOS first), last query, 16 random
rankings. Each run loads the model, then times only the analysis (ranks start together at a
barrier). On this 2-core machine the single process already uses both cores through torch's
intra-op threads, so the ratio says what sharding costs or gains, not what more hardware gives.

    python -m benchmarks.bench_distributed
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

WINDOWS, LENGTH = 8, 256


def _child() -> None:
    import torch

    import tl_geometry as tlg
    from tl_geometry.run.distributed import init_from_env

    torch.set_grad_enabled(False)
    rank, size = init_from_env()
    if size > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // size))
    model = tlg.load_model("smollm2-135m")
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(100, model.cfg.d_vocab - 100, (WINDOWS, LENGTH), generator=gen)
    tokens[:, 0] = model.tokenizer.bos_token_id
    if size > 1:
        import torch.distributed as dist

        dist.barrier()
    start = time.perf_counter()
    tlg.analyze(model, tokens, progress=False, bootstrap=100)
    seconds = time.perf_counter() - start
    if rank == 0:
        print(json.dumps({"seconds": seconds, "processes": size}))


def _timed(cmd: list[str]) -> float:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def main() -> None:
    if sys.argv[1:] == ["child"]:
        _child()
        return
    one = _timed([sys.executable, "-m", "benchmarks.bench_distributed", "child"])
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    two = _timed([torchrun, "--nproc_per_node", "2", "--master_port", "29541", "-m", "benchmarks.bench_distributed", "child"])
    result = {"one_process_seconds": one, "two_process_seconds": two, "throughput_ratio": one / two,
              "windows": WINDOWS, "seq_len": LENGTH}
    print(f"1 process {one:.2f} s, 2 processes {two:.2f} s: throughput ratio {one / two:.2f}")
    out = Path(__file__).parent / "results" / "distributed.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
