"""Which kv heads can stream (claim C12): streaming curves of every order on a bundled model, as Markdown.

    python demos/streaming_claims.py --model smollm2-135m --windows 2 --seq-len 1024

The analysis (its taxonomy orders the kv heads) runs on the same windows, last query, with the
taxonomy's votes from every query. Prints the curves, the area between each order's curve and the
oracle's, what each order cost, and writes the figure as HTML beside the Markdown if asked.
"""

from __future__ import annotations

import argparse
import time

import tl_geometry as tlg
from tl_geometry.capture.corpus import load_corpus, make_windows
from tl_geometry.label.head_types import head_types


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--corpus", default="python-reference")
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--sink", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--html", default=None)
    args = parser.parse_args()
    model = tlg.load_model(args.model)
    windows = make_windows(model, load_corpus(args.corpus), args.seq_len, args.windows, seed=0).tokens
    cost = {}
    start = time.perf_counter()
    analysis = tlg.analyze(model, windows, progress=False, bootstrap=1)
    cost["taxonomy"] = f"the analysis: {time.perf_counter() - start:.0f} s"
    start = time.perf_counter()
    types = head_types(model)
    cost["echo_induction"] = f"one forward of 101 tokens: {time.perf_counter() - start:.1f} s"
    start = time.perf_counter()
    curve = tlg.intervene.streaming_curve(model, windows, analysis, window=args.window, sink=args.sink, seeds=args.seeds,
                                types=types, checkpoint=args.checkpoint)
    total = time.perf_counter() - start
    n_kv = curve.settings["n_kv_total"]
    cost["entropy"] = "one pass over the windows (in the total below)"
    cost["oracle"] = f"{n_kv} evaluations, one per kv head (in the total below)"
    cost["random"] = f"{args.seeds} seeds × {len(curve.fractions)} fractions (in the total below)"
    print(f"## {args.model}: streaming kv heads, {args.windows} × {args.seq_len} tokens of {args.corpus}, "
          f"sink {args.sink} + window {args.window} ({n_kv} kv heads; baseline NLL {curve.baseline_nll:.4f})\n")
    header = " | ".join(f"{f:.0%}" for f in curve.fractions)
    print(f"| order | {header} | area above the oracle |")
    print("|---|" + "---|" * (len(curve.fractions) + 1))
    area = curve.area_to_oracle()
    for name in curve.delta_nll:
        values = curve.mean_curve(name).tolist()
        label = f"random (mean of {args.seeds})" if name == "random" else name
        print(f"| {label} | " + " | ".join(f"{v:+.4f}" for v in values) + f" | {area.get(name, float('nan')):+.4f} |")
    if "random" in curve.delta_nll:
        runs = curve.delta_nll["random"]
        print("| random (range) | " + " | ".join(f"{lo:+.3f}…{hi:+.3f}" for lo, hi in
                                                zip(runs.amin(0).tolist(), runs.amax(0).tolist(), strict=True)) + " | |")
    print("\nCost of each order's ranking: " + "; ".join(f"{k}: {v}" for k, v in cost.items()))
    print(f"\nStreaming evaluations, all orders: {total:.0f} s")
    if args.html:
        tlg.plots.streaming_plot(curve).write_html(args.html, include_plotlyjs="cdn")


if __name__ == "__main__":
    main()
