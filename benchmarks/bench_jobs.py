"""The loss-evaluating jobs against the plain forwards they replace, and against an earlier commit.

Two jobs, as users call them: the single-head scan (``tlg.intervene.single_head_scan``: every head alone)
and the streaming oracle (``tlg.intervene.streaming_curve(..., orders="oracle")``: every kv head alone,
then one fraction). Their "plain forwards" are the forwards a job without reuse runs, timed on
the same batches without hooks: for the scan, ``n_layers`` passes over the ``n_heads`` replicas
of every window plus the baseline; for the oracle, ``n_kv + 2`` passes over the windows. Each
job of this tree and of ``rev`` (exported as in ``bench_ab``) is timed between two plain passes,
round after round in alternating order; ratios are to the mean of the two neighbours.

    python -m benchmarks.bench_jobs 6bdae67                                # SmolLM2, 1 × 16 tokens
    python -m benchmarks.bench_jobs 6bdae67 --windows 4 --length 128 --rounds 3
    python -m benchmarks.bench_jobs 6bdae67 --model gemma-3-270m --threads 1
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
from pathlib import Path

from .bench_ab import _timed, export_package, jobs_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the earlier commit (anything git accepts)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--windows", type=int, default=1)
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()

    import torch

    import tl_geometry as new
    from tl_geometry.capture.adapters import sequence_nll
    from tl_geometry.capture.model_info import describe_model

    from .bench_analysis import _tokens

    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, tmp)
        old = importlib.import_module(export_package(args.rev, Path(tmp)))
        model = new.load_model(args.model)
        info = describe_model(model)
        tokens = _tokens(model, args.windows, args.length)
        window, sink = max(2, args.length // 4), 1

        def passes(batch, count):
            for _ in range(count):
                for start in range(0, batch.shape[0], args.batch_size):
                    sequence_nll(model, batch[start:start + args.batch_size])

        replicas = tokens.repeat(info.n_heads, 1)
        plain = {
            "scan": lambda: (passes(tokens, 1), passes(replicas, info.n_layers)),
            "oracle": lambda: passes(tokens, info.n_layers * info.n_kv_heads + 2),
        }

        def job(package, name):
            if name == "scan":
                return lambda: jobs_of(package).single_head_scan(model, tokens, batch_size=args.batch_size, progress=False)
            return lambda: jobs_of(package).streaming_curve(model, tokens, orders="oracle", fractions=(0.1,), window=window,
                                                   sink=sink, batch_size=args.batch_size, progress=False)

        packages = {"old": old, "new": new}
        results = {}
        for package in packages.values():  # warm up, and the tables must agree
            for name in plain:
                results.setdefault(name, []).append(job(package, name)())
        scans = results["scan"]
        scan_gap = float((scans[0] - scans[1]).abs().max())
        oracle_gap = float((results["oracle"][0].needs["oracle"] - results["oracle"][1].needs["oracle"]).abs().max())
        ratios = {(side, name): [] for side in packages for name in plain}
        for round_index in range(args.rounds):
            order = list(packages) if round_index % 2 == 0 else list(reversed(packages))
            for name in plain:
                before = _timed(plain[name])
                for side in order:
                    seconds = _timed(job(packages[side], name))
                    after = _timed(plain[name])
                    ratios[(side, name)].append(seconds / ((before + after) / 2))
                    before = after
    print(f"{args.model}, {tuple(tokens.shape)} tokens, batch size {args.batch_size}, threads "
          f"{torch.get_num_threads()}, {args.rounds} rounds; job time / its plain forwards (median, range); largest "
          f"difference between the two commits' tables: scan {scan_gap:.2e}, oracle {oracle_gap:.2e}")
    for name in plain:
        old_r, new_r = ratios[("old", name)], ratios[("new", name)]
        quotient = [b / a for a, b in zip(old_r, new_r, strict=True)]
        print(f"  {name:6s} {args.rev}: {statistics.median(old_r):.3f} ({min(old_r):.3f}–{max(old_r):.3f})  "
              f"this tree: {statistics.median(new_r):.3f} ({min(new_r):.3f}–{max(new_r):.3f})  "
              f"new/old per round: {statistics.median(quotient):.3f} ({min(quotient):.3f}–{max(quotient):.3f})")


if __name__ == "__main__":
    main()
