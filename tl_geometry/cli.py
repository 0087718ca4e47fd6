"""The ``tl-geometry`` command line.

``tl-geometry analyze`` cuts windows from a corpus, streams the model once over them and
writes per-head separability (top-N vs random), sink diagnostics, regime certificates and the
head taxonomy into a run folder. Errors are one clear
line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

__all__ = ["main"]


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


def _parse_n(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise CliError(f"--n must be comma-separated integers, e.g. 1,2,4,8; got {text!r}") from None
    if not values or min(values) < 1:
        raise CliError(f"--n values must be integers ≥ 1; got {text!r}")
    return values


def _analyze(args: argparse.Namespace) -> None:
    from .analysis import analyze
    from .corpus import load_corpus, make_windows
    from .models import BUNDLED_MODELS, load_model

    if args.model not in BUNDLED_MODELS and "/" not in args.model:
        raise CliError(f"unknown model {args.model!r}: use one of {', '.join(BUNDLED_MODELS)} or a Hugging Face name")
    ns = _parse_n(args.n)
    if max(ns) >= args.seq_len:
        raise CliError(f"--n {max(ns)} is out of range for --seq-len {args.seq_len}: N must be < the number of sources")
    out = Path(args.out or f"runs/{args.model}-{Path(str(args.corpus)).stem}")
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / ".write-test").write_text("")
        (out / ".write-test").unlink()
    except OSError as exc:
        raise CliError(f"output folder {str(out)!r} is not writable ({exc.strerror})") from None
    say = (lambda *a: None) if args.quiet else print
    start = time.perf_counter()
    model = load_model(args.model)
    say(f"loaded {args.model} in {time.perf_counter() - start:.1f}s")
    windows = make_windows(model, load_corpus(args.corpus), args.seq_len, args.windows, args.seed)
    say(f"{windows.tokens.shape[0]} windows x {args.seq_len} tokens from {windows.corpus} "
        f"({windows.skipped_documents} documents too short)")
    analysis = analyze(
        model, windows.tokens, ns, queries=args.queries, repeats=args.repeats, seed=args.seed,
        batch_size=args.batch_size, progress=not args.quiet,
    )
    result = analysis.geometry
    for settings in (result.settings, analysis.taxonomy.settings):
        settings.update(windows.describe())
    analysis.save(out)
    analysis.heads_table().to_csv(out / "heads.csv", index=False)
    summary = result.summary()
    summary.to_csv(out / "summary.csv", index=False)
    (out / "settings.json").write_text(json.dumps(result.settings, indent=1))
    say(f"\nF_N, all heads ({args.queries} queries; mean over sequences, 95% bootstrap CI):")
    for row in summary.itertuples():
        say(f"  N={row.n:<3d} top-N {row.f_top:.3f} [{row.f_top_low:.3f}, {row.f_top_high:.3f}]  "
            f"random {row.f_random:.3f}  gap {row.gap + 0.0:+.3f} [{row.gap_low + 0.0:+.3f}, {row.gap_high + 0.0:+.3f}]")
    overall = analysis.taxonomy.fractions().iloc[-1]
    say(f"head regimes: retriever {overall['retriever']:.1%}, mixer {overall['mixer']:.1%}, reset {overall['reset']:.1%}")
    say(f"done in {time.perf_counter() - start:.0f}s; results in {out}/ "
        "(heads.csv, summary.csv, geometry.safetensors, taxonomy.safetensors)")
    print(out.resolve())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tl-geometry", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    analyze = sub.add_parser("analyze", help="analyse a model's attention geometry over a corpus")
    analyze.add_argument("--model", default="smollm2-135m")
    analyze.add_argument("--corpus", default="python-reference", help="offline: python-reference (default), lee-news; hub: wikitext-103, openwebtext; or a .txt/.jsonl path")
    analyze.add_argument("--windows", type=int, default=64)
    analyze.add_argument("--seq-len", type=int, default=256)
    analyze.add_argument("--n", default="1,2,4,8,16,32", help="comma-separated N values")
    analyze.add_argument("--queries", choices=["last", "all"], default="last")
    analyze.add_argument("--repeats", type=int, default=16, help="random rankings per query")
    analyze.add_argument("--batch-size", type=int, default=8)
    analyze.add_argument("--seed", type=int, default=0)
    analyze.add_argument("--out", default=None, help="run folder (default runs/MODEL-CORPUS)")
    analyze.add_argument("--quiet", action="store_true", help="print only the result folder")
    analyze.set_defaults(run=_analyze)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except (CliError, ValueError, ModuleNotFoundError, OSError) as exc:
        print(f"tl-geometry: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tl-geometry: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
