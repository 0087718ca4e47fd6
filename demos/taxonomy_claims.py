"""Taxonomy claims (docs/metrics.md#claims: C5, C6, C7) on a bundled model and both offline corpora, as Markdown.

    python demos/taxonomy_claims.py --model smollm2-135m --windows 32 > out.md

One streamed ``tlg.analyze`` pass per corpus (taxonomy from every query, geometry from the last
query), and one over repeated random sequences (BOS + R + R); then the regimes of each against
TransformerLens's head types (``tlg.head_types``: ``detect_head``'s scores on a repeated random
sequence).
"""

from __future__ import annotations

import argparse
import time

import torch

import tl_geometry as tlg
from tl_geometry.capture.corpus import load_corpus, make_windows
from tl_geometry.label.head_types import HEAD_TYPES, repeated_random_tokens

CORPORA = ("python-reference", "lee-news")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def crosstab_lines(types: tlg.HeadTypes, taxonomy: tlg.HeadTaxonomy) -> list[str]:
    """The regimes against TransformerLens's head types, as a Markdown table."""
    table = types.crosstab(taxonomy)
    lines = ["| regime | " + " | ".join(map(str, table.columns)) + " |", "|---|" + "---|" * len(table.columns)]
    lines += [f"| {regime} | " + " | ".join(str(int(x)) for x in row) + " |" for regime, row in table.iterrows()]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--windows", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--corpora", nargs="+", default=list(CORPORA),
                        help="offline corpora whose labels are compared (the first one's are detailed)")
    parser.add_argument("--also-seq-len", type=int, default=None,
                        help="also label the first corpus at this window length, and compare the labels")
    args = parser.parse_args()
    start = time.perf_counter()
    model = tlg.load_model(args.model)
    runs, corpora = {}, args.corpora
    for corpus in corpora:
        windows = make_windows(model, load_corpus(corpus), args.seq_len, args.windows, seed=0)
        runs[corpus] = tlg.analyze(model, windows.tokens, repeats=0, bootstrap=200)
    print(f"## {args.model} — {args.windows} windows × {args.seq_len} tokens per corpus, "
          f"votes from every query ({time.perf_counter() - start:.0f} s)\n")
    print("| corpus | retriever | mixer | reset |", "|---|---|---|---|", sep="\n")
    for corpus, res in runs.items():
        overall = res.taxonomy.fractions().iloc[-1]
        print(f"| {corpus} | {_pct(overall['retriever'])} | {_pct(overall['mixer'])} | {_pct(overall['reset'])} |")
    first = runs[corpora[0]].taxonomy
    print()
    for other in corpora[1:]:
        stats = first.agreement(runs[other].taxonomy)
        print(f"Label agreement between {corpora[0]} and {other}: {_pct(stats['agreement'])} of heads, "
              f"Cohen's κ = {stats['kappa']:.2f}.\n")
    if args.also_seq_len:
        # the same corpus and as many tokens at another window length: do the labels depend on it?
        n_windows = max(1, args.windows * args.seq_len // args.also_seq_len)
        windows = make_windows(model, load_corpus(corpora[0]), args.also_seq_len, n_windows, seed=0)
        stats = first.agreement(tlg.analyze(model, windows.tokens, repeats=0, bootstrap=200, progress=False).taxonomy)
        print(f"Label agreement between {args.seq_len}- and {args.also_seq_len}-token windows of {corpora[0]} "
              f"({n_windows} windows): {_pct(stats['agreement'])} of heads, Cohen's κ = {stats['kappa']:.2f}.\n")
    print(f"Per layer ({corpora[0]}): share of retriever / mixer / reset heads\n")
    print("| layer | retriever | mixer | reset |", "|---|---|---|---|", sep="\n")
    for row in first.fractions().iloc[:-1].itertuples():
        print(f"| {row.layer} | {row.retriever:.2f} | {row.mixer:.2f} | {row.reset:.2f} |")
    res = runs[corpora[0]]
    print(f"\nC7, {corpora[0]}: mean cos(s_N, v_0) (sink) and cos(s_N, v_t) (current) per regime\n")
    sink, current = res.regime_means("align_sink"), res.regime_means("align_current")
    print("| regime | " + " | ".join(f"sink N={n}" for n in res.geometry.n[1:4]) + " | "
          + " | ".join(f"current N={n}" for n in res.geometry.n[1:4]) + " |")
    print("|---|" + "---|" * 6)
    for regime in sink.index:
        print(f"| {regime} | " + " | ".join(f"{x:+.3f}" for x in sink.loc[regime].iloc[1:4]) + " | "
              + " | ".join(f"{x:+.3f}" for x in current.loc[regime].iloc[1:4]) + " |")
    types = tlg.head_types(model)
    repeated = torch.cat([repeated_random_tokens(model, args.seq_len // 2, seed=seed)[:, :args.seq_len]
                          for seed in range(args.windows)])
    runs["repeated random tokens"] = tlg.analyze(model, repeated, repeats=0, bootstrap=200)
    print(f"\nHead types (`tlg.head_types`: TransformerLens's detect_head scores on BOS + 2 × "
          f"{types.settings['length']} repeated random tokens; a head is of the type whose score is highest "
          "and at least half of what a head of that type reaches there):\n")
    for kind in HEAD_TYPES:
        scores = getattr(types, kind)
        top = scores.flatten().argsort(descending=True)[:3].tolist()
        shown = ", ".join(f"L{i // scores.shape[1]}H{i % scores.shape[1]} {float(scores.flatten()[i]):.2f}" for i in top)
        print(f"- {kind.replace('_', '-')}: {int((types.labels() == kind).sum())} heads; strongest {shown}")
    for corpus in (corpora[0], "repeated random tokens"):
        print(f"\nRegimes ({corpus}, votes from every query) against head types\n")
        print("\n".join(crosstab_lines(types, runs[corpus].taxonomy)))

if __name__ == "__main__":
    main()
