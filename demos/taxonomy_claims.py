"""Taxonomy claims (docs/metrics.md#claims: C5, C6, C7) on a bundled model and both offline corpora, as Markdown.

    python demos/taxonomy_claims.py --model smollm2-135m --windows 32 > out.md

One streamed ``tlg.analyze`` pass per corpus (taxonomy from every query, geometry from the last
query), then TransformerLens's ``detect_head`` on a repeated random sequence: the taxonomy's
labels of the strongest previous-token and induction heads.
"""

from __future__ import annotations

import argparse
import time

import torch

import tl_geometry as tlg
from tl_geometry.corpus import load_corpus, make_windows

CORPORA = ("python-reference", "lee-news")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def detect_head_comparison(model, analysis: tlg.Analysis, top: int = 3) -> list[str]:
    """Strongest previous-token and induction heads by detect_head, with the taxonomy's view."""
    from transformer_lens.head_detector import detect_head

    gen = torch.Generator().manual_seed(0)
    half = torch.randint(1000, model.cfg.d_vocab - 1000, (40,), generator=gen)
    text = model.tokenizer.decode(torch.cat([half, half]))
    lines = ["| detect_head pattern | head | score | regime | shares (current / sink / other) | dominant offset |",
             "|---|---|---|---|---|---|"]
    tax = analysis.taxonomy
    for pattern in ("previous_token_head", "induction_head"):
        scores = detect_head(model, text, pattern, exclude_bos=False)
        for flat in scores.flatten().argsort(descending=True)[:top].tolist():
            layer, head = divmod(flat, scores.shape[1])
            shares = " / ".join(f"{x:.2f}" for x in tax.shares[layer, head].tolist())
            lines.append(f"| {pattern} | L{layer}H{head} | {scores[layer, head]:.3f} | {tax.labels[layer, head]} | "
                         f"{shares} | {int(tax.dominant_offset[layer, head])} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--windows", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=256)
    args = parser.parse_args()
    start = time.perf_counter()
    model = tlg.load_model(args.model)
    runs = {}
    for corpus in CORPORA:
        windows = make_windows(model, load_corpus(corpus), args.seq_len, args.windows, seed=0)
        runs[corpus] = tlg.analyze(model, windows.tokens, repeats=0, bootstrap=200)
    print(f"## {args.model} — {args.windows} windows × {args.seq_len} tokens per corpus, "
          f"votes from every query ({time.perf_counter() - start:.0f} s)\n")
    print("| corpus | retriever | mixer | reset |", "|---|---|---|---|", sep="\n")
    for corpus, res in runs.items():
        overall = res.taxonomy.fractions().iloc[-1]
        print(f"| {corpus} | {_pct(overall['retriever'])} | {_pct(overall['mixer'])} | {_pct(overall['reset'])} |")
    first, second = (runs[c].taxonomy for c in CORPORA)
    stats = first.agreement(second)
    print(f"\nLabel agreement between corpora: {_pct(stats['agreement'])} of heads, Cohen's κ = {stats['kappa']:.2f}.\n")
    print("Per layer (python-reference): share of retriever / mixer / reset heads\n")
    print("| layer | retriever | mixer | reset |", "|---|---|---|---|", sep="\n")
    for row in first.fractions().iloc[:-1].itertuples():
        print(f"| {row.layer} | {row.retriever:.2f} | {row.mixer:.2f} | {row.reset:.2f} |")
    res = runs[CORPORA[0]]
    print("\nC7, python-reference: mean cos(s_N, v_0) (sink) and cos(s_N, v_t) (current) per regime\n")
    sink, current = res.regime_means("align_sink"), res.regime_means("align_current")
    print("| regime | " + " | ".join(f"sink N={n}" for n in res.geometry.n[1:4]) + " | "
          + " | ".join(f"current N={n}" for n in res.geometry.n[1:4]) + " |")
    print("|---|" + "---|" * 6)
    for regime in sink.index:
        print(f"| {regime} | " + " | ".join(f"{x:+.3f}" for x in sink.loc[regime].iloc[1:4]) + " | "
              + " | ".join(f"{x:+.3f}" for x in current.loc[regime].iloc[1:4]) + " |")
    print("\nTransformerLens `detect_head` on 40 random tokens repeated twice, and the taxonomy's labels\n")
    print("\n".join(detect_head_comparison(model, res)))


if __name__ == "__main__":
    main()
