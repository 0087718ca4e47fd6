"""Interleaved A/B of what users run: ``tlg.analyze`` of this tree against an earlier commit's.

Each side runs in a process of its own (the earlier commit's ``tl_geometry/`` exported by ``git
archive`` under another package name; its imports are relative), on one model and one batch,
and the two are timed round after round in alternating order, each analysis call followed by a
plain forward in the same process (its ratio is to the mean of the plain forwards before and
after it, as in ``bench_analysis``). The ratios of the two commits, and their quotient per
round, come from the same run on the same machine, so a change's cost is measured apart from
the machine's drift. Not one process for both: numba's per-process table of argument types does
not tell apart two NamedTuple classes of one name and one shape (both commits' ``LayerRows``,
``Values``, ...), so the package whose bundles are typed second is dispatched through Python on
every kernel call (about 1 ms a call), and the two would share numba's and torch's thread pools.

    python -m benchmarks.bench_ab 6bdae67                     # SmolLM2 8 × 256, last and all queries
    python -m benchmarks.bench_ab 6bdae67 --model gemma-3-270m --windows 4 --rounds 5
    python -m benchmarks.bench_ab 6bdae67 --protocol cli --windows 32 --rounds 3     # the CLI's windows
    python -m benchmarks.bench_ab 6bdae67 --protocol paper --windows 4 --rounds 3    # 1024-token windows
    python -m benchmarks.bench_ab 92be6d7 --layer-pass --rounds 31                   # the layer pass alone

Protocols: ``random`` (random tokens, ``--windows`` × ``--length``, last and all queries), ``cli``
(``tl-geometry analyze``'s defaults: 256-token windows of python-reference, last query, batches
of 8), ``paper`` (``--protocol paper``: 1024-token random windows, last query, batches of 8); the
plain forward runs the same batches.

``--layer-pass`` times the measurement alone, without the forward whose noise hides a change of
a few per cent in the whole call: each side's ``measure_layer`` and accumulation over every third
layer, captured once per side from one batch, interleaved round by round.
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
from collections.abc import Callable
from pathlib import Path

from .bench_analysis import _timed

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


def submodule(package, folder_path: str):
    """``package``'s module at ``folder_path`` (e.g. ``"run.geometry"``), or its flat name at commits
    from before the layer folders (``"geometry"``)."""
    try:
        return importlib.import_module(f"{package.__name__}.{folder_path}")
    except ModuleNotFoundError:
        return importlib.import_module(f"{package.__name__}.{folder_path.rsplit('.', 1)[-1]}")


def layer_pass_seconds(package, model, tokens, queries: str) -> Callable[[], float]:
    """A timer of ``package``'s layer pass (measure and accumulate) over layers captured once."""
    import torch

    measures = submodule(package, "measure.layer_measures")
    geometry = submodule(package, "run.geometry")
    config = submodule(package, "config").RunConfig(queries=queries)
    captured: dict[int, object] = {}
    submodule(package, "capture.adapters").stream_layers(
        model, tokens, captured.__setitem__, layers=range(0, model.cfg.n_layers, 3))

    def run() -> float:
        accumulator = geometry.SeparabilityAccumulator(model.cfg.n_layers, model.cfg.n_heads, config)
        accumulator.start_batch(torch.arange(tokens.shape[0]), tokens.shape[1])
        workspace = measures.Workspace()
        start = time.perf_counter()
        for layer, att in captured.items():
            accumulator.add(layer, measures.measure_layer(att, config, accumulator.random_draws(att),
                                                          workspace=workspace), att.heads_per_kv)
        return time.perf_counter() - start
    return run


def _tokens_of(model, protocol: str, windows: int, length: int):
    from .bench_analysis import _tokens

    if protocol == "cli":
        from tl_geometry.capture.corpus import load_corpus, make_windows

        return make_windows(model, load_corpus("python-reference"), 256, windows, 0).tokens
    return _tokens(model, windows, 1024, seed=1) if protocol == "paper" else _tokens(model, windows, length)


def _serve(conn, package_root: str, package_name: str, model_name: str, protocol: tuple, tokens) -> None:
    """One side's process: its package and the model, then timings on request until ``None``.
    ``tokens`` None: built here from ``protocol`` and sent back first."""
    import torch

    from .bench_analysis import _plain_batches

    sys.path.insert(0, package_root)
    package = importlib.import_module(package_name)
    torch.set_grad_enabled(False)
    model = package.load_model(model_name)
    if tokens is None:
        tokens = _tokens_of(model, *protocol)
        conn.send(tokens)
    timers: dict[str, Callable[[], float]] = {}

    def layer_pass(queries: str) -> float:
        if queries not in timers:  # capture once
            timers[queries] = layer_pass_seconds(package, model, tokens, queries)
        return timers[queries]()

    requests = {
        "warm": lambda options: _timed(lambda: package.analyze(model, tokens[:1, :256], progress=False, **options)),
        "analyze": lambda options: _timed(lambda: package.analyze(model, tokens, progress=False, **options)),
        "plain": lambda _: _timed(lambda: _plain_batches(model, tokens)),
        "layer pass": layer_pass,
    }
    while (request := conn.recv()) is not None:
        conn.send(requests[request[0]](request[1]))


class Side:
    """One commit's package in a process of its own; ``side(kind, argument)`` answers in seconds."""

    def __init__(self, package_root: str, package_name: str, model_name: str, protocol: tuple, tokens=None):
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, package_root, package_name, model_name,
                                                            protocol, tokens), daemon=True)
        self.process.start()
        self.tokens = self.conn.recv() if tokens is None else tokens

    def __call__(self, kind: str, argument=None) -> float:
        self.conn.send((kind, argument))
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.process.join()


def _layer_pass_ab(sides: dict[str, Side], rounds: int) -> None:
    for queries in ("last", "all"):
        for side in sides.values():  # compile, capture and warm up
            side("layer pass", queries)
        seconds = {name: [] for name in sides}
        for round_index in range(rounds):
            for name in (list(sides) if round_index % 2 == 0 else list(reversed(sides))):
                seconds[name].append(sides[name]("layer pass", queries))
        quotient = [b / a for a, b in zip(seconds["old"], seconds["new"], strict=True)]
        print(f"  layer pass, {queries:4s} queries: old {statistics.median(seconds['old']) * 1e3:.1f} ms, this tree "
              f"{statistics.median(seconds['new']) * 1e3:.1f} ms; new/old per round: {statistics.median(quotient):.3f} "
              f"({min(quotient):.3f}–{max(quotient):.3f})")


def _analyze_ab(sides: dict[str, Side], variants: dict[str, dict], rounds: int) -> tuple[list, dict]:
    for side in sides.values():
        for options in variants.values():
            side("warm", options)
    ratios = {(name, variant): [] for name in sides for variant in variants}
    plain = [sides["new"]("plain")]
    for round_index in range(rounds):
        order = list(sides) if round_index % 2 == 0 else list(reversed(sides))
        for variant, options in variants.items():
            for name in order:
                seconds = sides[name]("analyze", options)
                plain.append(sides[name]("plain"))
                ratios[(name, variant)].append(seconds / ((plain[-2] + plain[-1]) / 2))
    return plain, ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the earlier commit (anything git accepts)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--protocol", choices=("random", "cli", "paper"), default="random")
    parser.add_argument("--layer-pass", action="store_true", help="time the measurement alone")
    args = parser.parse_args()

    protocol = (args.protocol, args.windows, args.length)
    variants = {"last": {}, "all": {"queries": "all"}} if args.protocol == "random" else {"last": {}}
    with tempfile.TemporaryDirectory() as tmp:
        new = Side(str(ROOT), "tl_geometry", args.model, protocol)
        sides = {"old": Side(tmp, export_package(args.rev, Path(tmp)), args.model, protocol, new.tokens), "new": new}
        shape = tuple(new.tokens.shape)
        try:
            if args.layer_pass:
                print(f"{args.model} {args.protocol} {shape}, {args.rounds} rounds, every third layer:")
                _layer_pass_ab(sides, args.rounds)
                return
            plain, ratios = _analyze_ab(sides, variants, args.rounds)
        finally:
            for side in sides.values():
                side.close()
    print(f"{args.model} {args.protocol} {shape}, {args.rounds} rounds, plain forward median "
          f"{statistics.median(plain):.2f} s; ratio to the plain forward (median, range):")
    for variant in variants:
        old_r, new_r = ratios[("old", variant)], ratios[("new", variant)]
        quotient = [b / a for a, b in zip(old_r, new_r, strict=True)]
        print(f"  {variant:4s} {args.rev}: {statistics.median(old_r):.3f} ({min(old_r):.3f}–{max(old_r):.3f})  "
              f"this tree: {statistics.median(new_r):.3f} ({min(new_r):.3f}–{max(new_r):.3f})  "
              f"new/old per round: {statistics.median(quotient):.3f} ({min(quotient):.3f}–{max(quotient):.3f})")


if __name__ == "__main__":
    main()
