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
import tempfile
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


def _parse_repeats(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise CliError(f"--repeats must be 'auto' or an integer ≥ 0; got {text!r}") from None


def _writable_folder(out: Path) -> Path:
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):  # a file of its own: torchrun ranks check at once
            pass
    except OSError as exc:
        raise CliError(f"output folder {str(out)!r} is not writable ({exc.strerror})") from None
    return out


def _run_folder(path: str) -> Path:
    run = Path(path)
    if not (run / "geometry.safetensors").is_file() or not (run / "taxonomy.safetensors").is_file():
        raise CliError(f"{path!r} is not a finished run folder (no geometry/taxonomy results): run tl-geometry analyze first")
    return run


def _drilldowns(model, analysis, windows, out: Path) -> None:
    """Drill-down figures of the most confident head of each regime on the first window, saved as
    JSON so ``tl-geometry report`` can rebuild the page without the model."""
    from .plots import head_drilldown
    from .taxonomy import REGIMES

    tokenizer = model.tokenizer
    text = tokenizer.decode(windows.tokens[0, 1:65].tolist())
    tax = analysis.taxonomy
    for i, regime in enumerate(REGIMES):
        chosen = tax.label_ids == i
        if not bool(chosen.any()):
            continue
        confidence = tax.shares[..., i].where(chosen, -1.0)
        layer, head = divmod(int(confidence.flatten().argmax()), tax.shape[1])
        fig = head_drilldown(model, text, layer, head, n=4)
        fig.update_layout(title=f"{regime}: {fig.layout.title.text}")
        (out / f"drilldown_{regime}.json").write_text(fig.to_json())


def _rebuild_report(run: Path, title: str | None = None) -> Path:
    """report.html from the files of a run folder (no model needed)."""
    import pandas as pd
    import plotly.io
    import torch

    from .analysis import Analysis
    from .interventions import TopNDeletion
    from .report import write_report

    analysis = Analysis.load(run)
    extras = {}
    if (run / "pruning.csv").is_file():
        extras["pruning"] = pd.read_csv(run / "pruning.csv")
    if (run / "single_head_scan.csv").is_file():
        frame = pd.read_csv(run / "single_head_scan.csv")
        scan = torch.full(analysis.taxonomy.shape, torch.nan)
        scan[frame["layer"].to_numpy(), frame["head"].to_numpy()] = torch.tensor(frame["delta_nll"].to_numpy().copy()).float()
        extras["scan"] = scan
    if (run / "topn.csv").is_file():
        frame = pd.read_csv(run / "topn.csv")
        extras["topn"] = [TopNDeletion(tuple(part["n"]), torch.tensor(part["delta_nll"].to_numpy().copy()), float("nan"),
                                       bool(renorm), {}) for renorm, part in frame.groupby("renormalise")]
    drilldowns = [plotly.io.read_json(path) for path in sorted(run.glob("drilldown_*.json"))]
    settings = analysis.geometry.settings
    title = title or f"tl_geometry: {settings.get('model', '?')} on {settings.get('corpus', '?')}"
    return write_report(analysis, run / "report.html", title=title, drilldowns=drilldowns, **extras)


def _model_options(args: argparse.Namespace) -> dict:
    """Device, dtype and multi-device placement flags for ``load_model``."""
    import torch

    options: dict = {"dtype": {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]}
    if args.device:
        options["device"] = args.device
    if args.device_map:
        options["device_map"] = args.device_map
    if args.n_devices:
        options["n_devices"] = args.n_devices
    return options


def _analyze(args: argparse.Namespace) -> None:
    from .analysis import analyze
    from .config import RunConfig
    from .corpus import load_corpus, make_windows
    from .distributed import init_from_env
    from .models import BUNDLED_MODELS, load_model

    rank, world_size = init_from_env()  # under torchrun: windows are sharded over the ranks
    if rank > 0:
        args.quiet = True

    if args.model not in BUNDLED_MODELS and "/" not in args.model:
        raise CliError(f"unknown model {args.model!r}: use one of {', '.join(BUNDLED_MODELS)} or a Hugging Face name")
    ns = _parse_n(args.n)
    try:
        config = RunConfig(n=ns, queries=args.queries, repeats=_parse_repeats(args.repeats), seed=args.seed)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if max(ns) >= args.seq_len:
        raise CliError(f"--n {max(ns)} is out of range for --seq-len {args.seq_len}: N must be < the number of sources")
    out = _writable_folder(Path(args.out or f"runs/{args.model}-{Path(str(args.corpus)).stem}"))
    say = (lambda *a: None) if args.quiet else print
    checkpoint = out / "checkpoint.safetensors"
    if checkpoint.exists() and not args.resume:
        say(f"removing the checkpoint of an earlier interrupted run ({checkpoint}); pass --resume to continue it")
        checkpoint.unlink()
    start = time.perf_counter()
    corpus = load_corpus(args.corpus)
    model = load_model(args.model, **_model_options(args))
    say(f"loaded {args.model} in {time.perf_counter() - start:.1f}s")
    windows = make_windows(model, corpus, args.seq_len, args.windows, args.seed)
    say(f"{windows.tokens.shape[0]} windows x {args.seq_len} tokens from {windows.corpus} "
        f"({windows.skipped_documents} documents too short)")
    started = time.perf_counter()
    analysis = analyze(model, windows.tokens, config=config, batch_size=args.batch_size, checkpoint=checkpoint,
                       progress=not args.quiet)
    say(f"analysed {windows.tokens.numel()} tokens at {windows.tokens.numel() / (time.perf_counter() - started):.0f} "
        "tokens/s (model forward included)")
    if rank > 0:  # rank 0 writes the results and the report
        return
    result = analysis.geometry
    for settings in (result.settings, analysis.taxonomy.settings):
        settings.update(windows.describe(), cli_model=args.model, corpus_spec=str(args.corpus), world_size=world_size)
    analysis.save(out)
    analysis.heads_table().to_csv(out / "heads.csv", index=False)
    summary = result.summary()
    summary.to_csv(out / "summary.csv", index=False)
    (out / "settings.json").write_text(json.dumps(result.settings, indent=1))
    _drilldowns(model, analysis, windows, out)
    report = _rebuild_report(out)
    checkpoint.unlink(missing_ok=True)
    say(f"\nF_N, all heads ({args.queries} queries; mean over sequences, 95% bootstrap CI):")
    for row in summary.itertuples():
        say(f"  N={row.n:<3d} top-N {row.f_top:.3f} [{row.f_top_low:.3f}, {row.f_top_high:.3f}]  "
            f"random {row.f_random:.3f}  gap {row.gap + 0.0:+.3f} [{row.gap_low + 0.0:+.3f}, {row.gap_high + 0.0:+.3f}]")
    overall = analysis.taxonomy.fractions().iloc[-1]
    say(f"head regimes: retriever {overall['retriever']:.1%}, mixer {overall['mixer']:.1%}, reset {overall['reset']:.1%}")
    say(f"done in {time.perf_counter() - start:.0f}s; results in {out}/ "
        "(report.html, heads.csv, summary.csv, geometry.safetensors, taxonomy.safetensors)")
    print(report.resolve())


def _prune(args: argparse.Namespace) -> None:
    import pandas as pd

    from .analysis import Analysis
    from .corpus import load_corpus, make_windows
    from .interventions import (
        IMPORTANCE_METHODS,
        head_importance,
        pruning_curve,
        single_head_scan,
        topn_deletion,
    )
    from .io import head_name
    from .models import load_model

    run = _writable_folder(_run_folder(args.run))
    say = (lambda *a: None) if args.quiet else print
    settings = json.loads((run / "settings.json").read_text())
    analysis = Analysis.load(run)
    start = time.perf_counter()
    name = args.model or settings.get("cli_model")
    if name is None:
        raise CliError("the run's settings.json does not say which model it analysed; pass --model")
    model = load_model(name)
    corpus = load_corpus(settings.get("corpus_spec", settings["corpus"]))
    # Held-out windows: another seed than the analysis, same length.
    held = make_windows(model, corpus, args.seq_len, args.windows, int(settings.get("seed", 0)) + 1).tokens
    # Gradient and entropy rank heads on the first half of the held-out windows (magnitude, random and
    # taxonomy need no tokens); the curves are measured on the other half.
    importances = {m: head_importance(model, held[: args.windows // 2], m, taxonomy=analysis.taxonomy)
                   for m in IMPORTANCE_METHODS}
    evaluation = held[args.windows // 2:] if args.windows > 1 else held
    curve = pruning_curve(model, evaluation, importances, progress=not args.quiet)
    curve.to_csv(run / "pruning.csv", index=False)
    say(f"pruning curves ({evaluation.shape[0]} held-out windows x {evaluation.shape[1]} tokens) in {run / 'pruning.csv'}")
    scan_tokens = evaluation[: args.scan_windows, : args.scan_seq_len]
    scan = single_head_scan(model, scan_tokens, checkpoint=run / "scan_checkpoint.json", progress=not args.quiet)
    grid = [(layer, head) for layer in range(scan.shape[0]) for head in range(scan.shape[1])]
    pd.DataFrame({"layer": [g[0] for g in grid], "head": [g[1] for g in grid], "name": [head_name(a, b) for a, b in grid],
                  "delta_nll": scan.flatten().double().numpy()}).to_csv(run / "single_head_scan.csv", index=False)
    rows = []
    for renormalise in (False, True):
        result = topn_deletion(model, evaluation, renormalise=renormalise, progress=not args.quiet)
        rows += [{"n": n, "delta_nll": float(d), "renormalise": renormalise} for n, d in zip(result.n, result.delta_nll, strict=True)]
    pd.DataFrame(rows).to_csv(run / "topn.csv", index=False)
    report = _rebuild_report(run)
    say(f"done in {time.perf_counter() - start:.0f}s")
    print(report.resolve())


def _report(args: argparse.Namespace) -> None:
    run = _run_folder(args.run)
    print(_rebuild_report(run).resolve())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tl-geometry", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    analyze = sub.add_parser("analyze", help="analyse a model's attention geometry over a corpus")
    analyze.add_argument("--model", default="smollm2-135m")
    analyze.add_argument("--corpus", default="python-reference", help="offline: python-reference (default), lee-news; hub: wikitext-103, openwebtext; or a .txt/.jsonl path")
    analyze.add_argument("--windows", type=int, default=64)
    analyze.add_argument("--seq-len", type=int, default=256)
    analyze.add_argument("--n", "--n-values", dest="n", default="1,2,4,8,16,32",
                         help="comma-separated N values (spell it --n-values under torchrun, whose parser claims --n)")
    analyze.add_argument("--queries", choices=["last", "all"], default="last")
    analyze.add_argument("--repeats", default="auto",
                         help="random rankings per query, or auto (default): 16 with --queries last, one per "
                              "query with --queries all (at least 16 draws per window and head)")
    analyze.add_argument("--batch-size", type=int, default=8)
    analyze.add_argument("--seed", type=int, default=0)
    analyze.add_argument("--out", default=None, help="run folder (default runs/MODEL-CORPUS)")
    analyze.add_argument("--device", default=None, help="e.g. cuda, cuda:1, cpu (default: TransformerLens's choice)")
    analyze.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                         help="model weights; geometry is always float32 or wider")
    analyze.add_argument("--device-map", default=None, help="hub models: e.g. auto, to spread layers over GPUs")
    analyze.add_argument("--n-devices", type=int, default=None, help="hub models: number of GPUs to split layers over")
    analyze.add_argument("--resume", action="store_true", help="continue an interrupted run in the same folder")
    analyze.add_argument("--quiet", action="store_true", help="print only the report path")
    analyze.set_defaults(handler=_analyze)
    prune = sub.add_parser("prune", help="pruning curves, single-head scan and top-N deletion for a finished run")
    prune.add_argument("run", help="run folder written by tl-geometry analyze")
    prune.add_argument("--windows", type=int, default=16, help="held-out windows (half rank gradient/entropy, half evaluate)")
    prune.add_argument("--seq-len", type=int, default=256)
    prune.add_argument("--scan-windows", type=int, default=4)
    prune.add_argument("--scan-seq-len", type=int, default=128)
    prune.add_argument("--model", default=None, help="model name when the run's settings do not say")
    prune.add_argument("--quiet", action="store_true")
    prune.set_defaults(handler=_prune)
    report = sub.add_parser("report", help="rebuild report.html of a run folder from its saved results")
    report.add_argument("run")
    report.set_defaults(handler=_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.handler(args)
    except (CliError, ValueError, ModuleNotFoundError, OSError) as exc:
        print(f"tl-geometry: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tl-geometry: interrupted; rerun the same command with --resume to continue", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
