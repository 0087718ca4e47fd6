"""Whole jobs, this tree against an earlier commit, on one model: streaming curves with every
default order, pruning curves and the single-head scan (``bench_jobs`` times two jobs against
their plain forwards at small sizes; this one times what ``tl-geometry stream`` and ``prune`` run,
at reduced sizes that fit a session). One run per side, old first; tables compared.

``--memory``: instead, each job and side runs in a process of its own and reports its peak
resident memory above what the model, windows, analysis and one plain forward already hold
(Linux: the peak is reset through ``/proc/self/clear_refs`` once the setup is done).

    python -m benchmarks.bench_jobs_ab 252fc1a --model smollm2-135m --stream-len 256 --prune-windows 4
    python -m benchmarks.bench_jobs_ab 252fc1a --memory
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .bench_ab import export_package, jobs_of

JOBS = ("stream (every order)", "pruning curves", "single-head scan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--stream-len", type=int, default=256)
    parser.add_argument("--prune-windows", type=int, default=4)
    parser.add_argument("--memory", action="store_true", help="peak memory per job and side instead of time")
    parser.add_argument("--one", choices=JOBS, help=argparse.SUPPRESS)  # a child of --memory
    parser.add_argument("--side", choices=("old", "new"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    import torch

    torch.set_grad_enabled(False)
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, tmp)
        packages = {"old": importlib.import_module(export_package(args.rev, Path(tmp))),
                    "new": importlib.import_module("tl_geometry")}
        if args.one:
            run = _jobs(args, packages[args.side])[args.one]
            start = _rss_kib()
            _reset_peak()
            run()
            print(f"{(_peak_kib() - start) / 1024:.1f}")
        elif args.memory:
            for name in JOBS:
                peak = {side: float(subprocess.run(
                    [sys.executable, "-m", "benchmarks.bench_jobs_ab", args.rev, "--model", args.model,
                     "--stream-len", str(args.stream_len), "--prune-windows", str(args.prune_windows),
                     "--one", name, "--side", side], check=True, capture_output=True, text=True).stdout.split()[-1])
                    for side in ("old", "new")}
                print(f"{args.model} {name}: peak memory above the setup {args.rev} {peak['old']:.0f} MiB, "
                      f"this tree {peak['new']:.0f} MiB", flush=True)
        else:
            jobs = {side: _jobs(args, package) for side, package in packages.items()}
            for name in JOBS:
                seconds, tables = {}, {}
                for side in ("old", "new"):
                    start = time.perf_counter()
                    tables[side] = jobs[side][name]()
                    seconds[side] = time.perf_counter() - start
                same = (tables["old"].equals(tables["new"]) if hasattr(tables["old"], "equals")
                        else bool(torch.equal(tables["old"], tables["new"])))
                gap = "" if same else f" (largest difference {_gap(tables['old'], tables['new']):.2e})"
                print(f"{args.model} {name}: {args.rev} {seconds['old']:.1f} s, this tree {seconds['new']:.1f} s, "
                      f"speed-up {seconds['old'] / seconds['new']:.2f}x; tables identical: {same}{gap}", flush=True)


def _jobs(args, tlg) -> dict:
    """Each job of ``tlg`` (a package: this tree or the earlier commit) as a call, its inputs made."""
    import tl_geometry as new
    from tl_geometry.capture.corpus import make_windows

    model = new.load_model(args.model)
    analysis = tlg.analyze(model, make_windows(model, "python-reference", 256, 2, 0).tokens, progress=False)
    stream_tokens = make_windows(model, "python-reference", args.stream_len, 1, 2).tokens
    held = make_windows(model, "python-reference", 256, args.prune_windows, 1).tokens
    importances = {m: new.intervene.head_importance(model, held, m, taxonomy=analysis.taxonomy)
                   for m in ("magnitude", "random", "taxonomy")}
    types = tlg.head_types(model)
    # one full forward first: the analysis and head types stop before the unembedding, and the first
    # [windows, pos, vocab] logits of a process raise its resident memory for good
    new.intervene.mean_nll(model, held)
    return {
        "stream (every order)": lambda: jobs_of(tlg).streaming_curve(
            model, stream_tokens, analysis.taxonomy, types=types, progress=False).to_dataframe(),
        "pruning curves": lambda: jobs_of(tlg).pruning_curve(model, held, importances, progress=False),
        "single-head scan": lambda: jobs_of(tlg).single_head_scan(model, held[:, :128], progress=False),
    }


def _status_kib(field: str) -> int:
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field + ":"))
    return int(line.split()[1])


def _rss_kib() -> int:
    return _status_kib("VmRSS")


def _peak_kib() -> int:
    return _status_kib("VmHWM")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def _gap(a, b) -> float:
    import torch

    if hasattr(a, "select_dtypes"):
        a, b = a.select_dtypes("number").to_numpy(), b.select_dtypes("number").to_numpy()
    return float((torch.as_tensor(a, dtype=torch.float64) - torch.as_tensor(b, dtype=torch.float64)).abs().nan_to_num().max())


if __name__ == "__main__":
    main()
