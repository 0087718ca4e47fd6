"""The ``tl-geometry`` command line.

Its parser (each subcommand's flags and handler) and entry point: user errors
(:class:`~tl_geometry.errors.TLGeometryError`) become one line and exit 2, interruptions say how to
resume, and real bugs keep their traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from ..errors import TLGeometryError
from .commands import analyze_command, analyze_interrupted, compare_command, report_command
from .derived_jobs import prune_command, stream_command
from .options import PROTOCOLS, HelpFormatter, model_flags, threads_flag, torch_threads

# What --help opens with, in plain words (the module docstring is for readers of the code).
DESCRIPTION = ("Which attention heads of a TransformerLens model do what: each head labelled retriever (the current "
               "token wins), mixer (the sink wins) or reset (another token wins), with the geometry of its top-N "
               "tokens, the attention sink and certified bounds. Start with: tl-geometry analyze")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tl-geometry", description=DESCRIPTION, formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    fmt = HelpFormatter
    analyze = sub.add_parser("analyze", help="analyse a model's attention geometry over a corpus", formatter_class=fmt,
                             description="Measure separability, sink diagnostics, certificates and the head taxonomy "
                                         "over corpus windows, and write a run folder with report.html.")
    analyze.add_argument("--model", default="smollm2-135m",
                         help="bundled offline model (smollm2-135m, gemma-3-270m) or a Hugging Face name")
    analyze.add_argument("--corpus", default="python-reference",
                         help="offline: python-reference, lee-news; hub: wikitext-103, openwebtext; or a .txt/.jsonl path")
    analyze.add_argument("--protocol", choices=list(PROTOCOLS), default="default",
                         help="preset of --seq-len, --queries, --n and --repeats: default (256-token windows, last "
                              "query, N = 1..32, auto random rankings) or paper (the published setting: 1024-token "
                              "windows, final query, N = 1..32, 16 random rankings); explicit flags override it")
    analyze.add_argument("--windows", type=int, default=64, help="number of windows cut from the corpus")
    analyze.add_argument("--seq-len", type=int, default=None,
                         help="tokens per window, BOS included (default: 256; 1024 with --protocol paper)")
    analyze.add_argument("--n", "--n-values", dest="n", default=None,
                         help="comma-separated N values, each < --seq-len (default: 1,2,4,8,16,32); spell it "
                              "--n-values under torchrun, whose parser claims --n")
    analyze.add_argument("--queries", choices=["last", "all"], default=None,
                         help="measure the last query of each window, or every query (default: last)")
    analyze.add_argument("--repeats", default=None,
                         help="random rankings per query, or auto: 16 with --queries last, one per "
                              "query with --queries all (at least 16 draws per window and head); 0 skips the "
                              "baseline (default: auto; 16 with --protocol paper)")
    analyze.add_argument("--batch-size", type=int, default=8, help="windows per forward pass")
    analyze.add_argument("--seed", type=int, default=0, help="seeds the windows and the random rankings")
    analyze.add_argument("--out", default=None, help="run folder (default: runs/MODEL-CORPUS)")
    model_flags(analyze)
    analyze.add_argument("--resume", action="store_true", help="continue an interrupted run in the same folder")
    analyze.add_argument("--overwrite", action="store_true",
                         help="replace a finished analysis in --out, with the pruning/scan results derived from it")
    analyze.add_argument("--quiet", action="store_true", help="print only the report path")
    threads_flag(analyze)
    analyze.set_defaults(handler=analyze_command, interrupted=analyze_interrupted)
    prune = _derived_parser(sub, "prune", "pruning curves, single-head scan and top-N deletion for a finished run",
                            windows=(16, "held-out windows (half rank gradient/entropy, half evaluate)"),
                            seq_len=(256, "tokens per held-out window"), handler=prune_command,
                            interrupted="rerun the same command: the single-head scan continues from its checkpoint")
    prune.add_argument("--scan-windows", type=int, default=4, help="windows of the single-head scan")
    prune.add_argument("--scan-seq-len", type=int, default=128, help="tokens per window of the single-head scan")
    stream = _derived_parser(sub, "stream", "which kv heads can keep only the sink and a recent window: streaming "
                             "curves per order for a finished run (SmolLM2 defaults: 11 min measured on 2 cores)",
                             windows=(1, "held-out windows the loss is measured on"),
                             seq_len=(None, "tokens per held-out window (default: 1024; 256 with --protocol default)"),
                             handler=stream_command, interrupted="rerun the same command: it continues from its checkpoint")
    stream.add_argument("--protocol", choices=list(PROTOCOLS), default="paper",
                        help="preset of --seq-len: paper (1024-token held-out windows, where a 64-key window is a "
                             "sixteenth of the context) or default (the analysis' 256); an explicit --seq-len wins")
    stream.add_argument("--window", type=int, default=64, help="recent keys a streaming head keeps, the query included")
    stream.add_argument("--sink", type=int, default=4, help="first positions a streaming head keeps")
    stream.add_argument("--orders", default="taxonomy,echo_induction,entropy,random,oracle",
                        help="orders to measure, comma-separated (the oracle costs one evaluation per kv head)")
    stream.add_argument("--fractions", default="0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9",
                        help="shares of kv heads that stream, comma-separated, in (0, 1]")
    stream.add_argument("--seeds", type=int, default=3, help="random orders")
    report = sub.add_parser("report", help="rebuild report.html of a run folder from its saved results",
                            formatter_class=fmt)
    report.add_argument("run", help="run folder written by tl-geometry analyze")
    report.set_defaults(handler=report_command, interrupted="rerun the same command")
    comparison = sub.add_parser("compare", help="compare two finished runs head by head (agreement, kappa, "
                                "transitions, per-head differences)", formatter_class=fmt)
    comparison.add_argument("run_a", help="first run folder (e.g. float32, base model, first corpus)")
    comparison.add_argument("run_b", help="second run folder; differences are second minus first")
    comparison.add_argument("--out", default=None, help="folder for compare.html and compare.csv "
                            "(default: runs/compare-A-vs-B)")
    comparison.add_argument("--overwrite", action="store_true", help="replace an earlier comparison in --out")
    comparison.set_defaults(handler=compare_command, interrupted="rerun the same command")
    return parser


def _derived_parser(sub, name: str, help: str, *, windows: tuple[int, str], seq_len: tuple[int | None, str],
                    handler: Callable[[argparse.Namespace], None], interrupted: str) -> argparse.ArgumentParser:
    """A job derived from a finished run (prune, stream): the run folder, its held-out windows and
    their length, the model when the run's settings do not say, --quiet and --threads; the caller
    adds the job's own flags."""
    job = sub.add_parser(name, help=help, formatter_class=HelpFormatter)
    job.add_argument("run", help="run folder written by tl-geometry analyze")
    job.add_argument("--windows", type=int, default=windows[0], help=windows[1])
    job.add_argument("--seq-len", type=int, default=seq_len[0], help=seq_len[1])
    job.add_argument("--model", default=None, help="model name when the run's settings do not say")
    job.add_argument("--quiet", action="store_true", help="print only the report path")
    threads_flag(job)
    job.set_defaults(handler=handler, interrupted=interrupted)
    return job


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with torch_threads(getattr(args, "threads", None)):
            args.handler(args)
    except TLGeometryError as exc:
        print(f"tl-geometry: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        advice = args.interrupted(args) if callable(args.interrupted) else args.interrupted
        print(f"tl-geometry: interrupted; {advice}", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
