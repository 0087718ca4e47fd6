"""Interleaved A/B of what users run: ``tlg.analyze`` of this tree against an earlier commit's.

Both packages are imported into one process (the earlier commit's ``tl_geometry/`` exported by
``git archive`` under another package name; its imports are relative), on one model and one
batch, and timed round after round in alternating order, each analysis call between two plain
forwards (its ratio is to their mean, as in ``bench_analysis``). The ratios of the two commits,
and their quotient per round, come from the same run on the same machine, so a change's cost
is measured apart from the machine's drift.

    python -m benchmarks.bench_ab 6bdae67                     # SmolLM2 8 × 256, last and all queries
    python -m benchmarks.bench_ab 6bdae67 --model gemma-3-270m --windows 4 --rounds 5
    python -m benchmarks.bench_ab 6bdae67 --protocol cli --windows 32 --rounds 3     # the CLI's windows
    python -m benchmarks.bench_ab 6bdae67 --protocol paper --windows 4 --rounds 3    # 1024-token windows

Protocols: ``random`` (random tokens, ``--windows`` × ``--length``, last and all queries), ``cli``
(``tl-geometry analyze``'s defaults: 256-token windows of python-reference, last query, batches
of 8), ``paper`` (``--protocol paper``: 1024-token random windows, last query, batches of 8); the
plain forward runs the same batches.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def export_package(rev: str, into: Path) -> str:
    """``tl_geometry/`` at ``rev`` as the package ``tlg_<rev>`` under ``into``; returns its name."""
    name = "tlg_" + "".join(ch for ch in rev if ch.isalnum())
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "tl_geometry"],
                             check=True, capture_output=True).stdout
    tar_path = into / "old.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    (into / "tl_geometry").rename(into / name)
    return name


def jobs_of(package):
    """A package's intervention jobs: ``package.intervene`` in this tree, the package itself at
    commits from before the layer folders."""
    return getattr(package, "intervene", package)


def _timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the earlier commit (anything git accepts)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--protocol", choices=("random", "cli", "paper"), default="random")
    args = parser.parse_args()

    import torch

    import tl_geometry as new

    from .bench_analysis import _plain_batches, _tokens

    torch.set_grad_enabled(False)
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, tmp)
        old = importlib.import_module(export_package(args.rev, Path(tmp)))
        model = new.load_model(args.model)
        variants = {"last": {}, "all": {"queries": "all"}}
        if args.protocol == "random":
            tokens = _tokens(model, args.windows, args.length)
        elif args.protocol == "cli":
            from tl_geometry.capture.corpus import load_corpus, make_windows

            tokens = make_windows(model, load_corpus("python-reference"), 256, args.windows, 0).tokens
            variants = {"last": {}}
        else:
            tokens = _tokens(model, args.windows, 1024, seed=1)
            variants = {"last": {}}
        packages = {"old": old, "new": new}
        for package in packages.values():  # compile and warm up
            for options in variants.values():
                package.analyze(model, tokens[:1, :256], progress=False, **options)
        ratios = {(side, variant): [] for side in packages for variant in variants}
        plain = [_timed(lambda: _plain_batches(model, tokens))]
        for round_index in range(args.rounds):
            order = list(packages) if round_index % 2 == 0 else list(reversed(packages))
            for variant, options in variants.items():
                for side in order:
                    seconds = _timed(lambda side=side, options=options: packages[side].analyze(
                        model, tokens, progress=False, **options))
                    plain.append(_timed(lambda: _plain_batches(model, tokens)))
                    ratios[(side, variant)].append(seconds / ((plain[-2] + plain[-1]) / 2))
    print(f"{args.model} {args.protocol} {tuple(tokens.shape)}, {args.rounds} rounds, plain forward median "
          f"{statistics.median(plain):.2f} s; ratio to the plain forward (median, range):")
    for variant in variants:
        old_r, new_r = ratios[("old", variant)], ratios[("new", variant)]
        quotient = [b / a for a, b in zip(old_r, new_r, strict=True)]
        print(f"  {variant:4s} {args.rev}: {statistics.median(old_r):.3f} ({min(old_r):.3f}–{max(old_r):.3f})  "
              f"this tree: {statistics.median(new_r):.3f} ({min(new_r):.3f}–{max(new_r):.3f})  "
              f"new/old per round: {statistics.median(quotient):.3f} ({min(quotient):.3f}–{max(quotient):.3f})")


if __name__ == "__main__":
    main()
