"""Reproduce claims C1–C11 of docs/metrics.md#claims on the bundled models; writes Markdown under docs/results/.

    python demos/reproduce.py                      # both models, ~1.5 h on 2 CPU cores
    python demos/reproduce.py --models smollm2-135m
    python demos/reproduce.py --protocol paper     # C1-C7, C10, C11 at 1024 tokens, ~15 min

Runs, per model, the three claim scripts (each one streamed analysis or intervention run with
its settings printed in its header) and writes their tables to
``docs/results/raw/{sink_regime,taxonomy,interventions}-<model>.md``; the curated pages in
docs/results/ and ``docs/reproduction.md`` quote them. ``--protocol paper`` runs the sink and
taxonomy claims (C1-C7, C10, C11) on 1024-token windows of python-reference, as many tokens as
the default's (8 windows where it cuts 32; C11's query-by-query check on one window, as many
queries as the default's 4), into ``raw/*-paper-<model>.md``; lee-news has no article long enough,
so C6 compares the labels with those of 256-token windows instead of the other corpus'. The
interventions (C8, C9) keep their own lengths.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (output name, script, extra arguments): C1-C4/C10/C11 on both offline corpora, C5-C7, C8-C9
RUNS = [
    ("sink_regime", "sink_claims.py", []),
    ("sink_regime-lee-news", "sink_claims.py", ["--corpus", "lee-news"]),
    ("taxonomy", "taxonomy_claims.py", []),
    ("interventions", "intervention_claims.py", []),
]
PAPER = ["--seq-len", "1024", "--windows", "8"]
# lee-news holds no article of 1023 tokens: at 1024 C6 compares the labels with those of 256-token windows
PAPER_RUNS = [
    ("sink_regime-paper", "sink_claims.py", [*PAPER, "--query-windows", "1"]),
    ("taxonomy-paper", "taxonomy_claims.py", [*PAPER, "--corpora", "python-reference", "--also-seq-len", "256"]),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma-3-270m"])
    parser.add_argument("--protocol", choices=("default", "paper"), default="default",
                        help="default: 256-token windows, every claim; paper: 1024-token windows, C1-C7, C10, C11")
    args = parser.parse_args()
    out = ROOT / "docs" / "results" / "raw"
    out.mkdir(parents=True, exist_ok=True)
    for model in args.models:
        for name, script, extra in PAPER_RUNS if args.protocol == "paper" else RUNS:
            run = subprocess.run([sys.executable, str(ROOT / "demos" / script), "--model", model, *extra],
                                 check=True, stdout=subprocess.PIPE, text=True, cwd=ROOT)
            path = out / f"{name}-{model}.md"
            path.write_text(run.stdout)
            print(f"{path.relative_to(ROOT)}", file=sys.stderr)
            print(run.stdout)


if __name__ == "__main__":
    main()
