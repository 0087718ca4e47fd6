"""The ``tl-geometry`` command line.

``tl-geometry analyze`` cuts windows from a corpus, streams the model once over them and
writes per-head separability (top-N vs random), sink diagnostics, regime certificates and the
head taxonomy into a run folder (:class:`~tl_geometry.run.run_folder.RunFolder`). Every input is
checked before the model loads where it can be, and before the forward otherwise. A user error
(:class:`~tl_geometry.errors.TLGeometryError`) is one line on stderr and exit status 2; anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

from ..config import Queries
from ..errors import TLGeometryError
from ..io import atomic_path
from ..run.run_folder import RunFolder
from .options import PROTOCOLS, apply_protocol, check_positive, parse_n, parse_repeats

__all__ = ["analyze_command", "analyze_interrupted", "report_command", "compare_command", "write_run_report", "check_model_name"]


def _drilldowns(model, analysis, windows) -> dict[str, str]:
    """Drill-down figures (JSON by regime) on the first window's text: for each regime, the surest
    head (:meth:`~tl_geometry.HeadTaxonomy.clearest`; uncertain ones only after every sure one) whose
    last query votes as its label does, so the example shows what the label means; saved so
    ``tl-geometry report`` can rebuild the page without the model."""
    from ..label.taxonomy import REGIMES
    from ..measure.votes import VOTES
    from ..present.drilldown import head_drilldown
    from ..run.inputs import tokenize_texts

    text = model.tokenizer.decode(windows.tokens[0, 1:65].tolist())
    n = min(4, tokenize_texts(model, [text])[0].shape[1] - 1)  # N < the sources of the last query
    if n < 1:
        return {}
    figures = {}
    for regime, heads in analysis.taxonomy.clearest(k=8, uncertain=True).items():
        for layer, head in heads:
            fig = head_drilldown(model, text, layer, head, n=n)
            if fig.layout.meta["winner"] == VOTES[REGIMES.index(regime)]:
                figures[regime] = fig.to_json()
                break
    return figures


def _report_parts(run: RunFolder, say=print) -> dict:
    """What report.html is built from, read from the files of a run folder (no model needed);
    derived tables of another analysis are left out, with a word."""
    from ..present.report import derived_results
    from ..run.results import Analysis

    analysis = Analysis.load(run.path)
    extras, left_out = derived_results(run, analysis)
    for name, why in left_out.items():
        say(f"left out of the report: {name} ({why})")
    settings = analysis.geometry.settings
    title = f"tl_geometry: {settings.get('model', '?')} on {settings.get('corpus', '?')}"
    return dict(analysis=analysis, title=title, drilldowns=_read_drilldowns(run), **extras)


def write_run_report(run: RunFolder, say=print, parts: dict | None = None) -> Path:
    """report.html of a run folder, from ``parts`` when the caller has read them already."""
    from ..present.report import write_report

    return write_report(path=run.report, **(_report_parts(run, say) if parts is None else parts))


def _check_model_flags(args: argparse.Namespace, bundled: bool) -> None:
    """The model flags, before the model loads: a device this machine has, placement flags only
    where they apply (hub models), a positive device count."""
    import torch

    if args.device:
        try:
            device = torch.device(args.device)
        except (RuntimeError, ValueError):
            raise TLGeometryError(f"--device {args.device!r} is not a device: use cpu, cuda, cuda:1 or mps") from None
        available = ["cpu"]
        if torch.cuda.is_available():
            available += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            available.append("mps")
        if device.type not in ("cpu", "cuda", "mps") or str(device) not in available:
            raise TLGeometryError(f"--device {args.device!r} is not available on this machine (it has: "
                                  f"{', '.join(available)})")
    if args.n_devices is not None and args.n_devices < 1:
        raise TLGeometryError(f"--n-devices must be ≥ 1; got {args.n_devices}")
    if bundled and (args.device_map or args.n_devices):
        flag = "--device-map" if args.device_map else "--n-devices"
        raise TLGeometryError(f"{flag} applies to Hugging Face hub models; the bundled {args.model} loads on one "
                              "device (use --device)")


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


def check_model_name(name: str) -> None:
    from ..capture.models import BUNDLED_MODELS

    if name not in BUNDLED_MODELS and "/" not in name:
        raise TLGeometryError(f"unknown model {name!r}: use one of {', '.join(BUNDLED_MODELS)} or a Hugging Face name")


def _default_out(args: argparse.Namespace) -> str:
    """``runs/<model>-<corpus>``, plus what sets this run apart from the defaults (dtype, window
    length, queries, seed), so runs with other settings do not meet in one folder."""
    name = f"{Path(str(args.model)).name}-{Path(str(args.corpus)).stem}"
    extras = [args.dtype if args.dtype != "float32" else "",
              f"len{args.seq_len}" if args.seq_len != PROTOCOLS["default"]["seq_len"] else "",
              f"{args.queries}-queries" if args.queries != "last" else "",
              f"seed{args.seed}" if args.seed != 0 else ""]
    return "runs/" + "-".join([name, *(extra for extra in extras if extra)])


def _say_results(analysis, queries: Queries, say) -> None:
    """The terminal's summary of a finished analysis: F_N top-N vs random with intervals, what NaN
    means, then the regimes in words with their surest heads and the uncertain ones."""
    from ..heads import head_name
    from ..label.taxonomy import regime_gloss
    from ..present.report import attention_notes

    result = analysis.geometry
    summary = result.summary()
    euclidean = result.settings.get("distance") == "euclidean"
    say(f"\nF_N, all heads ({queries} queries; mean over sequences, 95% bootstrap CI):")
    for row in summary.itertuples():
        if row.n == 1 and euclidean and abs(row.gap) < 5e-4:  # 1 by definition: no information
            continue
        say(f"  N={row.n:<3d} top-N {row.f_top:.3f} [{row.f_top_low:.3f}, {row.f_top_high:.3f}]  "
            f"random {row.f_random:.3f}  gap {row.gap + 0.0:+.3f} [{row.gap_low + 0.0:+.3f}, {row.gap_high + 0.0:+.3f}]")
    if 1 in result.n and euclidean:
        if any(row.n == 1 and abs(row.gap) >= 5e-4 for row in summary.itertuples()):  # visible at 3 decimals
            say("  N=1 gap above 0: some contributions coincide (a random pick among them scores F = 0; in float16, "
                "weights that underflow to 0 put their sources at the origin): docs/metrics.md#separability")
        else:
            say("  (N=1 left out: F = 1 by definition in a Euclidean run)")
    for reason in result.not_measurable():
        say(f"  NaN means {reason}")
    tax = analysis.taxonomy
    overall = tax.fractions().iloc[-1]
    say(f"head regimes (labels from {tax.basis}):")
    for i, (regime, heads) in enumerate(tax.clearest(3).items()):
        surest = ", ".join(f"{head_name(layer, head)} ({float(tax.shares[layer, head, i]):.0%})" for layer, head in heads)
        say(f"  {overall[regime]:6.1%} {regime_gloss(regime, familiar=True)}" + (f"; surest: {surest}" if surest else ""))
    uncertain = analysis.uncertain_heads()
    if uncertain:
        say(f"  {len(uncertain)} uncertain label{'s' if len(uncertain) != 1 else ''} (could flip on other text): "
            f"{', '.join(uncertain[:10])}{' …' if len(uncertain) > 10 else ''}")
    for line in attention_notes(analysis):  # sliding windows, windows without BOS (all is well: nothing said)
        if not line.startswith("Every window starts with BOS"):
            say(f"  {line}")


def analyze_command(args: argparse.Namespace) -> None:
    from ..capture.corpus import load_corpus, make_windows
    from ..capture.model_info import describe_model
    from ..capture.models import BUNDLED_MODELS, load_model
    from ..config import RunConfig
    from ..run.analysis import analyze
    from ..run.distributed import barrier, init_from_env, shard_path

    # Everything that can be checked without the model, before it loads and before the folder changes.
    apply_protocol(args)
    check_model_name(args.model)
    _check_model_flags(args, args.model in BUNDLED_MODELS)
    if args.seq_len < 2:
        raise TLGeometryError(f"--seq-len must be ≥ 2 (BOS and at least one token); got {args.seq_len}")
    check_positive("--windows", args.windows)
    check_positive("--batch-size", args.batch_size)
    ns = parse_n(args.n)
    if max(ns) >= args.seq_len:
        raise TLGeometryError(f"--n {max(ns)} is out of range for --seq-len {args.seq_len}: every N must be < the "
                              "number of sources (lower --n or raise --seq-len)")
    config = RunConfig(n=ns, queries=args.queries, repeats=parse_repeats(args.repeats), seed=args.seed)
    run = RunFolder(args.out or _default_out(args))
    rank, world_size = init_from_env()  # under torchrun: windows are sharded over the ranks
    if rank > 0:
        args.quiet = True
    say = (lambda *a: None) if args.quiet else print
    run.check_new_analysis(overwrite=args.overwrite, resume=args.resume)
    corpus = load_corpus(args.corpus)

    start = time.perf_counter()
    model = load_model(args.model, **_model_options(args))
    say(f"loaded {args.model} in {time.perf_counter() - start:.1f}s")
    describe_model(model).check_length(args.seq_len)
    windows = make_windows(model, corpus, args.seq_len, args.windows, args.seed)
    say(f"{windows.tokens.shape[0]} windows x {args.seq_len} tokens from {windows.corpus} "
        f"({windows.skipped_documents} documents shorter than a window skipped)")
    # The inputs are valid: from here one process writes the folder (rank 0 holds its lock).
    with run.writing(elsewhere=True) if rank == 0 else contextlib.nullcontext():
        if rank == 0:
            run.check_new_analysis(overwrite=args.overwrite, resume=args.resume)  # again, under the lock
        # The other ranks write only their checkpoint shards, and only once rank 0 has made the folder its own.
        barrier()
        own_checkpoint = shard_path(run.checkpoint, rank, world_size)
        if args.resume and not own_checkpoint.is_file():
            say(f"no checkpoint in {run.path}: starting from the first window")
        if not args.resume and run.drop_stale_checkpoint(rank, world_size):
            say(f"removed the checkpoint of an earlier interrupted run in {run.path} (pass --resume to continue one)")
        started = time.perf_counter()
        analysis = analyze(model, windows.tokens, config=config, batch_size=args.batch_size, checkpoint=run.checkpoint,
                           progress=not args.quiet)
        say(f"analysed {windows.tokens.numel()} tokens at {windows.tokens.numel() / (time.perf_counter() - started):.0f} "
            "tokens/s (model forward included)")
        if rank > 0:  # rank 0 writes the results and the report
            own_checkpoint.unlink(missing_ok=True)
            return
        result = analysis.geometry
        for settings in (result.settings, analysis.taxonomy.settings):
            settings.update(windows.describe(), cli_model=args.model, corpus_spec=str(args.corpus), world_size=world_size,
                            protocol=args.protocol)
        run.write_analysis(analysis, result.settings, _drilldowns(model, analysis, windows))
        report = write_run_report(run, say)
        own_checkpoint.unlink(missing_ok=True)
        _say_results(analysis, args.queries, say)
        say(f"done in {time.perf_counter() - start:.0f}s; results in {run.path}/ "
            "(report.html, heads.csv, summary.csv, geometry.safetensors, taxonomy.safetensors)")
        print(report.resolve())


def _read_drilldowns(run: RunFolder) -> list:
    """The run's drill-down figures (``drilldown_<regime>.json``), each one line if unreadable."""
    import plotly.io

    figures = []
    for path in sorted(run.path.glob("drilldown_*.json")):
        try:
            figures.append(plotly.io.read_json(path))
        except (OSError, ValueError) as exc:
            raise TLGeometryError(f"cannot read {path} ({exc}): rerun tl-geometry analyze") from None
    return figures


def analyze_interrupted(args: argparse.Namespace) -> str:
    """What to do after Ctrl-C, by the folder's state: resume an unfinished analysis, or write the
    report of one that was saved before the interrupt (``--resume`` never touches a finished one)."""
    run = RunFolder(args.out or _default_out(args))
    try:
        finished = run.is_finished
    except TLGeometryError:  # a manifest that names files outside the folder: say nothing about it here
        finished = False
    if finished:
        return f"the analysis was saved in {run.path}: write its report with tl-geometry report {run.path}"
    return "rerun the same command with --resume to continue"


def report_command(args: argparse.Namespace) -> None:
    run = RunFolder(args.run)
    parts = _report_parts(run, lambda *a: print(*a, file=sys.stderr))  # every file read before anything is written
    run.check_writable()
    with run.writing():
        print(write_run_report(run, parts=parts).resolve())


def compare_command(args: argparse.Namespace) -> None:
    from ..present.report import build_comparison
    from ..run.compare import compare
    from ..run.results import Analysis

    runs = [RunFolder(path) for path in (args.run_a, args.run_b)]
    resolved = [run.path.resolve() for run in runs]
    if resolved[0] == resolved[1]:
        raise TLGeometryError(f"{args.run_a!r} and {args.run_b!r} are the same run folder: compare two different runs")
    names = [path.name for path in resolved]
    if names[0] == names[1]:  # same folder name in two places: name each by its parent too (no path separators)
        names = [f"{path.parent.name}-{path.name}" for path in resolved]
        if names[0] == names[1]:
            names = [f"{name}-{i}" for i, name in enumerate(names, 1)]
    out = RunFolder(args.out or f"runs/compare-{names[0]}-vs-{names[1]}")
    page, table = out.path / "compare.html", out.path / "compare.csv"
    if not args.overwrite and page.exists() and table.exists():  # one alone: an interrupted comparison
        raise TLGeometryError(f"{out.path} already holds a comparison: pass --overwrite to replace it, or choose "
                              "another --out")
    analyses = [Analysis.load(run.path) for run in runs]
    out.check_writable()
    out.check_not_foreign(ours=(page.name, table.name))
    comparison = compare(*analyses, names=(names[0], names[1]))
    frame = comparison.to_dataframe() if comparison.head_by_head else comparison.curves()
    for line in comparison.summary_lines():
        print(line)
    # Both outputs are computed before either is written, and each is written atomically: a
    # failed or interrupted comparison leaves nothing that blocks its rerun.
    html = build_comparison(comparison)
    with out.writing(elsewhere=True):
        with atomic_path(table) as tmp:
            frame.to_csv(tmp, index=False)
        with atomic_path(page) as tmp:
            tmp.write_text(html, encoding="utf-8")
    print(page.resolve())

