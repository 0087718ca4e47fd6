"""Whole jobs, this tree against an earlier commit, on one model: streaming curves with every
default order, pruning curves and the single-head scan (``bench_jobs`` times two jobs against
their plain forwards at small sizes; this one times what ``tl-geometry stream`` and ``prune`` run,
at reduced sizes that fit a session). One run per side, old first; tables compared.

    python -m benchmarks.bench_jobs_ab 252fc1a --model smollm2-135m --stream-len 256 --prune-windows 4
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import time
from pathlib import Path

from .bench_ab import export_package


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--stream-len", type=int, default=256)
    parser.add_argument("--prune-windows", type=int, default=4)
    args = parser.parse_args()

    import torch

    import tl_geometry as new
    from tl_geometry.corpus import make_windows

    torch.set_grad_enabled(False)
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, tmp)
        old = importlib.import_module(export_package(args.rev, Path(tmp)))
        model = new.load_model(args.model)
        analysis = new.analyze(model, make_windows(model, "python-reference", 256, 2, 0).tokens, progress=False)
        stream_tokens = make_windows(model, "python-reference", args.stream_len, 1, 2).tokens
        held = make_windows(model, "python-reference", 256, args.prune_windows, 1).tokens
        importances = {m: new.head_importance(model, held, m, taxonomy=analysis.taxonomy)
                       for m in ("magnitude", "random", "taxonomy")}
        analysis_tokens = make_windows(model, "python-reference", 256, 2, 0).tokens
        own = {old: old.analyze(model, analysis_tokens, progress=False), new: analysis}  # each package's own classes
        jobs = {
            "stream (every order)": lambda tlg: tlg.streaming_curve(
                model, stream_tokens, own[tlg].taxonomy, types=tlg.head_types(model), progress=False).to_dataframe(),
            "pruning curves": lambda tlg: tlg.pruning_curve(model, held, importances, progress=False),
            "single-head scan": lambda tlg: tlg.single_head_scan(model, held[:, :128], progress=False),
        }
        for name, job in jobs.items():
            seconds, tables = {}, {}
            for side, package in (("old", old), ("new", new)):
                start = time.perf_counter()
                tables[side] = job(package)
                seconds[side] = time.perf_counter() - start
            same = (tables["old"].equals(tables["new"]) if hasattr(tables["old"], "equals")
                    else bool(torch.equal(tables["old"], tables["new"])))
            gap = "" if same else f" (largest difference {_gap(tables['old'], tables['new']):.2e})"
            print(f"{args.model} {name}: {args.rev} {seconds['old']:.1f} s, this tree {seconds['new']:.1f} s, "
                  f"speed-up {seconds['old'] / seconds['new']:.2f}x; tables identical: {same}{gap}", flush=True)


def _gap(a, b) -> float:
    import torch

    if hasattr(a, "select_dtypes"):
        a, b = a.select_dtypes("number").to_numpy(), b.select_dtypes("number").to_numpy()
    return float((torch.as_tensor(a, dtype=torch.float64) - torch.as_tensor(b, dtype=torch.float64)).abs().nan_to_num().max())


if __name__ == "__main__":
    main()
