"""The jobs derived from a finished run, ``tl-geometry prune`` and ``tl-geometry stream``, and the
frame they share (:func:`derived_job`): the run checked and its model loaded before the folder is
touched, held-out windows, one writer, the report rebuilt after."""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from ..errors import TLGeometryError
from ..run.derived_tables import scan_frame, topn_frame
from ..run.run_folder import RunFolder
from .commands import check_model_name, write_run_report
from .options import PROTOCOLS, check_positive, parse_fractions

__all__ = ["prune_command", "stream_command"]


def _finished_run(args: argparse.Namespace):
    """A finished run folder that a derived job (prune, stream) may write to, checked before any
    model loads: the folder, its analysis, the model name (``--model`` or the run's settings), the
    run's seed and its corpus."""
    from ..capture.corpus import load_corpus
    from ..run.results import Analysis

    run = RunFolder(args.run)
    analysis = Analysis.load(run.path)
    run.check_writable()
    settings = run.read_settings()
    name = args.model or settings.get("cli_model") or _bundled_name(settings.get("model"))
    if not isinstance(name, str):
        raise TLGeometryError("the run's settings.json does not say which model it analysed; pass --model")
    check_model_name(name)
    try:
        seed = int(settings.get("seed", 0))
    except (TypeError, ValueError):
        raise TLGeometryError(f"{run.settings}: seed {settings.get('seed')!r} is not an integer; fix it or rerun "
                              "tl-geometry analyze") from None
    corpus = load_corpus(settings.get("corpus_spec", settings.get("corpus", "python-reference")))
    return run, analysis, name, seed, corpus


def _bundled_name(model: object) -> str | None:
    """The bundled model's name (``load_model``'s) of a run whose settings name its model as the
    model says itself (``Analysis.save`` from a notebook writes no ``cli_model``)."""
    from ..capture.models import BUNDLED_MODELS

    return next((bundled.name for bundled in BUNDLED_MODELS.values() if bundled.official_name == model), None)


def _resume_or_restart(checkpoint, say) -> None:
    """A derived job's checkpoint in its run folder: resumed when it can be, else removed (its job
    or settings differ, or it is damaged), as ``analyze`` removes an earlier run's without --resume."""
    problem = checkpoint.problem()
    if problem is not None:
        checkpoint.drop()
        say(f"removed {checkpoint.path.name}: {problem}; starting afresh")


@dataclass(frozen=True)
class DerivedJob:
    """What a job derived from a finished run works with: the folder (held for writing), its
    analysis, the model, the held-out windows and where to say progress."""

    run: RunFolder
    analysis: Any
    model: Any
    held: Any
    say: Callable[..., None]

    @property
    def run_id(self) -> str | None:
        return self.analysis.geometry.settings.get("run_id")


@contextlib.contextmanager
def derived_job(args: argparse.Namespace, longest: int, seed_offset: int) -> Iterator[DerivedJob]:
    """The frame of ``prune`` and ``stream``: the finished run checked, its model loaded and checked
    against the analysis (windows up to ``longest`` tokens) before the folder is touched, held-out
    windows cut with another seed than the analysis (``seed + seed_offset``), then the folder held
    for writing (one writer; the analysis verified unchanged) while the job runs, and the report
    rebuilt after it."""
    from ..capture.corpus import make_windows
    from ..capture.model_info import describe_model
    from ..capture.models import load_model

    run, analysis, name, seed, corpus = _finished_run(args)
    say = (lambda *a: None) if args.quiet else print
    start = time.perf_counter()
    model = load_model(name)
    info = describe_model(model)
    info.check_length(longest)
    analysis.taxonomy.check_fits(info.n_layers, info.n_heads, "pass the analysis of this model (or --model)")
    held = make_windows(model, corpus, args.seq_len, args.windows, seed + seed_offset).tokens
    with run.writing():  # one writer: another prune, stream or analysis of this folder is refused
        run.verify()  # the analysis is still the one the tables are computed from
        yield DerivedJob(run, analysis, model, held, say)
        report = write_run_report(run, say)
        say(f"done in {time.perf_counter() - start:.0f}s")
        print(report.resolve())


def prune_command(args: argparse.Namespace) -> None:
    from ..intervene.importance import IMPORTANCE_METHODS, head_importance
    from ..intervene.pruning import pruning_curve, scan_checkpoint, single_head_scan, topn_deletion

    for flag in ("--windows", "--seq-len", "--scan-windows", "--scan-seq-len"):
        check_positive(flag, getattr(args, flag[2:].replace("-", "_")))
    if args.seq_len < 2 or args.scan_seq_len < 2:
        raise TLGeometryError("--seq-len and --scan-seq-len must be ≥ 2 (BOS and at least one token)")
    evaluated = args.windows - args.windows // 2 if args.windows > 1 else 1  # the held-out half the scan reads
    if args.scan_seq_len > args.seq_len or args.scan_windows > evaluated:
        raise TLGeometryError(f"the single-head scan reads the {evaluated} evaluation window(s) of --seq-len "
                              f"{args.seq_len} tokens; --scan-windows {args.scan_windows} × --scan-seq-len "
                              f"{args.scan_seq_len} asks for more: lower them, or raise --windows / --seq-len")
    with derived_job(args, args.seq_len, seed_offset=1) as job:
        run, model, say, progress = job.run, job.model, job.say, not args.quiet
        run.forget_derived(("pruning.csv", "single_head_scan.csv", "topn.csv"))  # this run's, or none
        # Gradient and entropy rank heads on the first half of the held-out windows (magnitude,
        # random and taxonomy need no tokens); the curves are measured on the other half.
        importances = {m: head_importance(model, job.held[: max(1, args.windows // 2)], m,
                                          taxonomy=job.analysis.taxonomy) for m in IMPORTANCE_METHODS}
        evaluation = job.held[args.windows // 2:] if args.windows > 1 else job.held
        if args.windows == 1:
            say("--windows 1: the gradient and entropy rankings and the curves use the same single window "
                "(pass --windows 2 or more to rank on one half and evaluate on the other)")
        curve = pruning_curve(model, evaluation, importances, progress=progress)
        path = run.write_derived("pruning.csv", curve, job.run_id)
        say(f"pruning curves ({evaluation.shape[0]} held-out windows x {evaluation.shape[1]} tokens) in {path}")
        scan_tokens = evaluation[: args.scan_windows, : args.scan_seq_len]
        _resume_or_restart(scan_checkpoint(run.scan_checkpoint, model, scan_tokens), say)
        scan = single_head_scan(model, scan_tokens, checkpoint=run.scan_checkpoint, progress=progress)
        run.write_derived("single_head_scan.csv", scan_frame(scan, scan_tokens.shape), job.run_id)
        run.write_derived("topn.csv", topn_frame([topn_deletion(model, evaluation, renormalise=renormalise, progress=progress)
                                                  for renormalise in (False, True)]), job.run_id)
        run.scan_checkpoint.unlink(missing_ok=True)


def stream_command(args: argparse.Namespace) -> None:
    from ..intervene.duo_attention import DUO_ATTENTION_FOLDER, duo_attention_pattern
    from ..intervene.streaming import check_streaming_arguments, stream_checkpoint, streaming_curve

    if args.seq_len is None:
        args.seq_len = PROTOCOLS[args.protocol]["seq_len"]
    for flag in ("--windows", "--seeds"):
        check_positive(flag, getattr(args, flag[2:].replace("-", "_")))
    if args.seq_len < 2:
        raise TLGeometryError(f"--seq-len must be ≥ 2 (BOS and at least one token); got {args.seq_len}")
    orders = tuple(args.orders.split(","))
    fractions = parse_fractions(args.fractions)
    check_streaming_arguments(args.seq_len, fractions, orders, args.window, args.sink, args.seeds)
    with derived_job(args, args.seq_len, seed_offset=2) as job:  # another seed than the pruning curves too
        run, held = job.run, job.held
        _resume_or_restart(stream_checkpoint(run.stream_checkpoint, job.model, held, window=args.window,
                                             sink=args.sink), job.say)
        curve = streaming_curve(job.model, held, job.analysis, fractions=fractions, window=args.window,
                                sink=args.sink, orders=orders, seeds=args.seeds, checkpoint=run.stream_checkpoint,
                                types=job.analysis.head_types, progress=not args.quiet)
        path = run.write_derived("streaming.csv", curve.to_dataframe(), job.run_id)
        run.stream_checkpoint.unlink(missing_ok=True)
        job.say(f"streaming curves ({held.shape[0]} held-out windows x {held.shape[1]} tokens) in {path}")
        if any(order != "random" for order in orders):  # a measured order: the decision kvpress applies
            pattern = duo_attention_pattern(curve)
            pattern = replace(pattern, settings={**pattern.settings, "run_id": job.run_id})
            folder = pattern.save(run.path / DUO_ATTENTION_FOLDER, overwrite=True)
            job.say(f"the {pattern.order} order as a DuoAttention pattern for kvpress in {folder}/")
        for order, area in curve.area_to_oracle().items():
            job.say(f"  {order}: area above the oracle {area:+.4f}")
