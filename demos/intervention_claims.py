"""Intervention claims (docs/metrics.md#claims: C8, C9) on a bundled model, as Markdown.

    python demos/intervention_claims.py --model smollm2-135m > out.md

Importance and taxonomy come from one set of windows; pruning curves and top-N deletion are
measured on held-out windows (another seed, overlapping windows dropped); the single-head scan
runs on a small subset of the held-out windows (it costs one forward per head).
"""

from __future__ import annotations

import argparse
import time
from typing import get_args

import tl_geometry as tlg
from tl_geometry.capture.corpus import load_corpus, make_windows


def held_out_windows(model, corpus, seq_len, n, fit_windows):
    """Windows of another seed whose (document, offset) never occurs among ``fit_windows``."""
    used = set(zip(fit_windows.doc_ids, fit_windows.offsets, strict=True))
    pool = make_windows(model, corpus, seq_len, 2 * n, seed=1)
    keep = [i for i, key in enumerate(zip(pool.doc_ids, pool.offsets, strict=True)) if key not in used][:n]
    return pool.tokens[keep]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--corpus", default="python-reference")
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--scan-windows", type=int, default=4)
    parser.add_argument("--scan-seq-len", type=int, default=128)
    args = parser.parse_args()
    start = time.perf_counter()
    model = tlg.load_model(args.model)
    corpus = load_corpus(args.corpus)
    fit = make_windows(model, corpus, args.seq_len, args.windows, seed=0)
    held = held_out_windows(model, corpus, args.seq_len, args.windows, fit)
    taxonomy = tlg.analyze(model, fit.tokens, progress=False).taxonomy
    importances = {method: tlg.intervene.head_importance(model, fit.tokens, method, taxonomy=taxonomy)
                   for method in get_args(tlg.intervene.ImportanceMethod)}
    curve = tlg.intervene.pruning_curve(model, held, importances, progress=False)
    print(f"## {args.model} — {args.corpus}; importance from {fit.tokens.shape[0]} windows, evaluation on "
          f"{held.shape[0]} held-out windows × {args.seq_len} tokens, zero ablation\n")
    print(f"Baseline NLL {curve.baseline_nll.iloc[0]:.4f} nats/token. Relative ΔNLL by retention (share of heads kept):\n")
    table = curve.pivot(index="method", columns="retention", values="delta_nll").sort_index(axis=1, ascending=False)
    print("| method | " + " | ".join(f"{r:g}" for r in table.columns) + " |")
    print("|---|" + "---|" * len(table.columns))
    for method, row in table.iterrows():
        print(f"| {method} | " + " | ".join(f"{x:+.3f}" for x in row) + " |")

    scan_tokens = held[:args.scan_windows, :args.scan_seq_len]
    scan = tlg.intervene.single_head_scan(model, scan_tokens, progress=False)
    print(f"\nSingle-head scan ({scan_tokens.shape[0]} windows × {scan_tokens.shape[1]} tokens): the 5 most "
          "critical heads\n")
    print("| head | ΔNLL | regime | shares (current / sink / other) |", "|---|---|---|---|", sep="\n")
    for flat in scan.flatten().argsort(descending=True)[:5].tolist():
        layer, head = divmod(flat, scan.shape[1])
        shares = " / ".join(f"{x:.2f}" for x in taxonomy.shares[layer, head].tolist())
        print(f"| L{layer}H{head} | {scan[layer, head]:+.3f} | {taxonomy.labels[layer, head]} | {shares} |")
    median = scan.flatten().median().item()
    print(f"\nMedian single-head ΔNLL {median:+.4f}; heads above +10%: {int((scan > 0.1).sum())}.")

    print("\nTop-N attention deletion (every head, every query keeps its top-N sources)\n")
    print("| N | ΔNLL (weights kept) | ΔNLL (renormalised) |", "|---|---|---|", sep="\n")
    ns = (1, 2, 4, 8, 16, 32, 64)
    plain = tlg.intervene.topn_deletion(model, held, ns, progress=False)
    renorm = tlg.intervene.topn_deletion(model, held, ns, renormalise=True, progress=False)
    for i, n in enumerate(ns):
        print(f"| {n} | {plain.delta_nll[i]:+.4f} | {renorm.delta_nll[i]:+.4f} |")
    print(f"\nSmallest N with ΔNLL ≤ 1% / 5% / 10%: weights kept {list(plain.smallest_n.values())}, "
          f"renormalised {list(renorm.smallest_n.values())}.")
    print(f"\n({time.perf_counter() - start:.0f} s on 2 CPU cores)")


if __name__ == "__main__":
    main()
