"""What users run, against a plain forward: ``tlg.analyze`` and ``tl-geometry analyze`` with their defaults.

One command, every ratio from this one run:

1. ``tlg.analyze(model, tokens)`` (last query) and ``tlg.analyze(model, tokens, queries="all")``
   against ``model(tokens)``: SmolLM2-135M on 8 × 256 and Gemma 3 270M on 4 × 256 random tokens
   (BOS first). Times: in one process, each analysis call between two plain forwards, round
   after round (5 rounds); each ratio is the median over rounds of the call's ratio to the mean of
   its two neighbouring plain forwards (the spread of those ratios is kept beside it);
   peak memory: one fresh process per call (``benchmarks/common.py``).
2. ``tl-geometry analyze`` with its defaults (64 windows × 256 tokens of ``python-reference``):
   its analysis call against plain forwards of the same windows in the same batches (in the
   order plain, analysis, analysis, plain; means).
3. Scaling of the full all-query analysis with the window length (256 → 2048 tokens, one
   window), time ratios and the fitted exponent of the analysis' extra time.
4. The paper's protocol (1024-token windows, final query; default N ladder) on SmolLM2, 8 windows:
   analysis against plain forwards of the same windows (before and after it).
5. Item 1 for SmolLM2 again with one core kept busy by another process
   (``python -c "while True: pass"``, running through both sides of every ratio).

    python -m benchmarks.bench_analysis            # writes benchmarks/results/analysis.json
    python -m benchmarks.bench_analysis busy       # item 5 alone (printed, not written)
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROUNDS = 5
CASES = {"smollm2-135m": (8, 256), "gemma-3-270m": (4, 256)}
LENGTHS = (256, 512, 1024, 2048)


def _tokens(model, windows: int, length: int, seed: int = 0):
    import torch

    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(100, model.cfg.d_vocab - 100, (windows, length), generator=gen)
    tokens[:, 0] = model.tokenizer.bos_token_id
    return tokens


def _calls(model, tokens) -> dict:
    import tl_geometry as tlg

    return {
        "plain": lambda: model(tokens, return_type=None),
        "analyze": lambda: tlg.analyze(model, tokens, progress=False),
        "analyze_all": lambda: tlg.analyze(model, tokens, queries="all", progress=False),
    }


def _plain_batches(model, tokens, batch_size: int = 8) -> None:
    for start in range(0, tokens.shape[0], batch_size):
        model(tokens[start:start + batch_size], return_type=None)


def _timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def child(argv: list[str]) -> None:
    import torch

    from benchmarks.common import PeakRSS
    from tl_geometry import load_model

    torch.set_grad_enabled(False)
    kind, name = argv[0], argv[1]
    model = load_model(name)
    windows, length = CASES[name]
    calls = _calls(model, _tokens(model, windows, length))
    for call in calls.values():
        call()  # warm-up (numba's cached machine code, allocator)
    if kind == "memory":
        with PeakRSS() as mem:
            calls[argv[2]]()
        print(json.dumps({"peak_bytes": mem.peak}))
        return
    # Each analysis call between two plain forwards (plain, analyze, plain, analyze_all, plain, …):
    # its ratio is to the mean of its two neighbours, so a drift of the machine's speed cancels to
    # first order; the median over rounds, with the spread of the rounds' ratios beside it.
    variants = [variant for variant in calls if variant != "plain"]
    times: dict[str, list[float]] = {variant: [] for variant in calls}
    round_ratios: dict[str, list[float]] = {variant: [] for variant in variants}
    plain = times["plain"]
    plain.append(_timed(calls["plain"]))
    for _ in range(ROUNDS):
        for variant in variants:
            times[variant].append(_timed(calls[variant]))
            plain.append(_timed(calls["plain"]))
            round_ratios[variant].append(times[variant][-1] / ((plain[-2] + plain[-1]) / 2))
    print(json.dumps({"seconds": {variant: statistics.median(values) for variant, values in times.items()},
                      "ratios": {variant: statistics.median(r) for variant, r in round_ratios.items()},
                      "ratio_range": {variant: [min(r), max(r)] for variant, r in round_ratios.items()}}))


def model_rows(name: str) -> dict:
    from benchmarks.common import run_fresh

    timed = run_fresh("benchmarks.bench_analysis", "time", name)
    rows = {variant: {"seconds": value} for variant, value in timed["seconds"].items()}
    for variant, ratio in timed["ratios"].items():
        rows[variant]["time_ratio"] = ratio
        rows[variant]["time_ratio_range"] = timed["ratio_range"][variant]
    for variant in rows:
        rows[variant].update(run_fresh("benchmarks.bench_analysis", "memory", name, variant, measure_memory=True))
    return rows


def busy_rows(name: str = "smollm2-135m") -> dict:
    """Item 1's time ratios of ``name`` with another process spinning on one core throughout."""
    from benchmarks.common import run_fresh

    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        timed = run_fresh("benchmarks.bench_analysis", "time", name)
    finally:
        spinner.kill()
        spinner.wait()
    return {"seconds": timed["seconds"], "ratios": timed["ratios"], "ratio_range": timed["ratio_range"]}


def _print_busy(busy: dict) -> None:
    print("one core busy, smollm2-135m 8x256: " + ", ".join(
        f"{variant} {busy['ratios'][variant]:.3f}x (rounds {low:.3f}-{high:.3f})"
        for variant, (low, high) in busy["ratio_range"].items()))


def cli_rows() -> dict:
    """The analysis call of ``tl-geometry analyze`` (its defaults) against plain forwards of its windows."""
    import tl_geometry as tlg
    from tl_geometry.capture.corpus import load_corpus, make_windows

    model = tlg.load_model("smollm2-135m")
    windows = make_windows(model, load_corpus("python-reference"), 256, 64, 0).tokens
    tlg.analyze(model, windows[:8], progress=False)  # warm-up
    # plain, analysis, analysis, plain: drift of the machine's speed hits both alike
    plain = [_timed(lambda: _plain_batches(model, windows))]
    analysis = [_timed(lambda: tlg.analyze(model, windows, progress=False)) for _ in range(2)]
    plain.append(_timed(lambda: _plain_batches(model, windows)))
    plain_s, analysis_s = statistics.mean(plain), statistics.mean(analysis)
    return {"windows": int(windows.shape[0]), "plain_seconds": plain_s, "analyze_seconds": analysis_s,
            "tokens_per_second": windows.numel() / analysis_s}


def scaling_rows() -> dict:
    import tl_geometry as tlg

    model = tlg.load_model("smollm2-135m")
    rows = {}
    for length in LENGTHS:
        tokens = _tokens(model, 1, length)
        tlg.analyze(model, tokens[:, :64], queries="all", progress=False)
        plain = [_timed(lambda tokens=tokens: model(tokens, return_type=None))]
        analysis = _timed(lambda tokens=tokens: tlg.analyze(model, tokens, queries="all", progress=False))
        plain = statistics.mean(plain + [_timed(lambda tokens=tokens: model(tokens, return_type=None))])
        rows[length] = {"plain_seconds": plain, "analyze_seconds": analysis, "ratio": analysis / plain}
    return rows


def paper_rows() -> dict:
    import tl_geometry as tlg

    model = tlg.load_model("smollm2-135m")
    tokens = _tokens(model, 8, 1024, seed=1)
    tlg.analyze(model, tokens[:1, :128], progress=False)
    plain = [_timed(lambda: _plain_batches(model, tokens))]
    analysis = _timed(lambda: tlg.analyze(model, tokens, progress=False))
    plain = statistics.mean(plain + [_timed(lambda: _plain_batches(model, tokens))])
    return {"windows": 8, "length": 1024, "plain_seconds": plain, "analyze_seconds": analysis}


def _slope(xs, ys) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum((a - mx) ** 2 for a in lx)


def main() -> None:
    if sys.argv[1:] == ["busy"]:
        _print_busy(busy_rows())
        return
    if sys.argv[1:]:
        child(sys.argv[1:])
        return
    import torch

    torch.set_grad_enabled(False)  # plain forwards as users time them (analyze runs in inference mode)
    out: dict = {"models": {}}
    for name, (windows, length) in CASES.items():
        rows = model_rows(name)
        plain = rows["plain"]
        out["models"][name] = rows
        print(f"{name}, {windows}x{length} tokens, CPU: plain forward {plain['seconds']:.2f} s, "
              f"{plain['peak_bytes'] / 2**20:.0f} MiB")
        for variant, target in (("analyze", "last query"), ("analyze_all", "all queries")):
            row = rows[variant]
            row["memory_ratio"] = row["peak_bytes"] / plain["peak_bytes"]
            low, high = row["time_ratio_range"]
            print(f"  tlg.analyze ({target}): {row['seconds']:.2f} s = {row['time_ratio']:.3f}x "
                  f"(rounds {low:.3f}-{high:.3f}), peak {row['peak_bytes'] / 2**20:.0f} MiB = {row['memory_ratio']:.3f}x")
    cli = cli_rows()
    cli["ratio"] = cli["analyze_seconds"] / cli["plain_seconds"]
    out["cli"] = cli
    print(f"tl-geometry analyze defaults ({cli['windows']} x 256): analysis {cli['analyze_seconds']:.1f} s vs plain "
          f"forwards {cli['plain_seconds']:.1f} s = {cli['ratio']:.3f}x ({cli['tokens_per_second']:.0f} tokens/s)")
    scaling = scaling_rows()
    extra = [max(row["analyze_seconds"] - row["plain_seconds"], 1e-3) for row in scaling.values()]
    out["scaling"] = {"rows": scaling, "plain_exponent": _slope(LENGTHS, [r["plain_seconds"] for r in scaling.values()]),
                      "analyze_exponent": _slope(LENGTHS, [r["analyze_seconds"] for r in scaling.values()]),
                      "extra_exponent": _slope(LENGTHS, extra)}
    print("all-query analysis, 1 window: " + ", ".join(f"{length}: {row['ratio']:.2f}x" for length, row in scaling.items())
          + f"; time exponents plain {out['scaling']['plain_exponent']:.2f}, analysis "
          f"{out['scaling']['analyze_exponent']:.2f}, extra {out['scaling']['extra_exponent']:.2f}")
    paper = paper_rows()
    paper["ratio"] = paper["analyze_seconds"] / paper["plain_seconds"]
    out["paper"] = paper
    print(f"paper protocol (8 x 1024, last query): analysis {paper['analyze_seconds']:.1f} s vs plain "
          f"{paper['plain_seconds']:.1f} s = {paper['ratio']:.3f}x")
    out["busy_core"] = busy_rows()
    _print_busy(out["busy_core"])
    path = Path(__file__).parent / "results" / "analysis.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
