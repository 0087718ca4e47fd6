"""Reproduce claims C1–C11 of docs/metrics.md#claims on the bundled models; writes Markdown under docs/results/.

    python demos/reproduce.py                      # both models, ~1.5 h on 2 CPU cores
    python demos/reproduce.py --models smollm2-135m

Runs, per model, the three claim scripts (each one streamed analysis or intervention run with
its settings printed in its header) and writes their tables to
``docs/results/raw/{sink_regime,taxonomy,interventions}-<model>.md``; the curated pages in
docs/results/ and ``docs/reproduction.md`` quote them.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma-3-270m"])
    args = parser.parse_args()
    out = ROOT / "docs" / "results" / "raw"
    out.mkdir(parents=True, exist_ok=True)
    for model in args.models:
        for name, script, extra in RUNS:
            run = subprocess.run([sys.executable, str(ROOT / "demos" / script), "--model", model, *extra],
                                 check=True, capture_output=True, text=True, cwd=ROOT)
            path = out / f"{name}-{model}.md"
            path.write_text(run.stdout)
            print(f"{path.relative_to(ROOT)}", file=sys.stderr)
            print(run.stdout)


if __name__ == "__main__":
    main()
