"""Sink and regime claims (docs/metrics.md#claims: C2, C3, C4, C10, C11) on a bundled model, as Markdown.

    python demos/sink_claims.py --model smollm2-135m --windows 32 > out.md

Runs one streamed analysis (last query of each window, sink diagnostics on) and prints the
tables quoted in ``docs/results/sink_regime.md`` and ``docs/theory.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

import tl_geometry as tlg
from tl_geometry.capture.corpus import load_corpus, make_windows


def _fmt(x: float) -> str:
    return f"{x:.3f}"


def report(res: tlg.GeometryResult) -> str:
    """Markdown tables of the sink claims from one result."""
    lines = []
    ratio, cosine = res.mean("norm_ratio").flatten(), res.mean("sink_cosine").flatten()
    heads = ratio.numel()
    lines += [
        "| claim | measured |", "|---|---|",
        f"| C2 median norm ratio (mean non-sink ‖v‖ / ‖v_0‖) over {heads} heads | {_fmt(ratio.median())} "
        f"(IQR {_fmt(ratio.quantile(0.25))}–{_fmt(ratio.quantile(0.75))}; ratio in [3, 10]: "
        f"{(((ratio >= 3) & (ratio <= 10)).float().mean() * 100):.0f}% of heads; > 1: {((ratio > 1).float().mean() * 100):.0f}%) |",
        f"| C3 heads with negative mean sink cosine | {((cosine < 0).float().mean() * 100):.0f}% "
        f"(median cosine {_fmt(cosine.median())}) |",
        f"| regime assumptions hold (norm spread ≤ 0.1, c0 < c, sign consistency ≥ 0.9) | "
        f"{(res.mean('regime_holds').flatten().mean() * 100):.0f}% of (head, window) pairs; median spread "
        f"{_fmt(res.mean('c_spread').median())}, median max coherence {_fmt(res.mean('coherence_max').median())} |",
        "",
        "| N | F top-N | F sink excluded | F sink selected | F sink not selected | share of queries with sink selected |",
        "|---|---|---|---|---|---|",
    ]

    def model_mean(name):  # heads and layers within each sequence, then sequences
        return res.per_sequence[name].nanmean((1, 2)).nanmean(0)

    f_top, f_nosink = model_mean("f_top"), model_mean("f_nosink")
    f_sel, f_unsel, share = model_mean("f_sink_selected"), model_mean("f_sink_unselected"), model_mean("sink_selected")
    for i, n in enumerate(res.n):
        lines.append(f"| {n} | {_fmt(f_top[i])} | {_fmt(f_nosink[i])} | {_fmt(f_sel[i])} | {_fmt(f_unsel[i])} | "
                     f"{_fmt(share[i])} |")
    lines += ["", "| N | P measured | P inversion cert. | P sink-aware bound | R measured | R inversion cert. | "
              "R sink-aware bound | F gap top − random |", "|---|---|---|---|---|---|---|---|"]
    gap = model_mean("f_top") - model_mean("f_random") if "f_random" in res.per_sequence else torch.full_like(f_top, float("nan"))
    cols = [model_mean(k) for k in ("precision_top", "precision_certificate", "precision_bound",
                                    "recall_top", "recall_certificate", "recall_bound")]
    for i, n in enumerate(res.n):
        lines.append(f"| {n} | " + " | ".join(_fmt(c[i]) for c in cols) + f" | {gap[i]:+.3f} |")
    violations, checks = certificate_violations(res)
    lines += ["", f"C11: bound above measurement in {violations} of {checks} (window, head, N) checks."]
    precision_share, recall_share = informative_shares(res)
    lines += [f"Sink-aware bound informative (last query t = {int(res.settings['seq_len']) - 1}): P̲ > N/(its candidates) in {precision_share:.1%}, "
              f"R̲ > 0 in {recall_share:.1%} of (window, head, N) cells."]
    return "\n".join(lines)


def certificate_violations(res: tlg.GeometryResult) -> tuple[int, int]:
    """(bound or certificate above its measurement, checks) over (window, head, N) cells. One query
    per window (the last), so the per-window values are per-query values."""
    violations = sum(
        int((res.per_sequence[b] > res.per_sequence[m]).sum())
        for b, m in (("precision_bound", "precision_top"), ("recall_bound", "recall_top"),
                     ("precision_certificate", "precision_top"), ("recall_certificate", "recall_top"))
    )
    return violations, 4 * int((~torch.isnan(res.per_sequence["precision_bound"])).sum())


def informative_shares(res: tlg.GeometryResult) -> tuple[float, float]:
    """Shares of defined cells where the sink-aware bound beats its trivial floor: P̲ above
    N / (the last query's candidates: t + 1 for t = seq_len − 1, or its layer's sliding window),
    R̲ above 0."""
    bound_p, bound_r = res.per_sequence["precision_bound"], res.per_sequence["recall_bound"]
    defined = ~torch.isnan(bound_p)
    seq_len = int(res.settings["seq_len"])
    windows = res.settings.get("sliding_windows") or {}
    seen = torch.tensor([min(seq_len, int(windows.get(str(layer), seq_len))) for layer in range(bound_p.shape[1])],
                        dtype=bound_p.dtype)
    trivial = torch.tensor(res.n, dtype=bound_p.dtype) / seen[:, None, None]  # [layer, 1, n]
    return (float((bound_p > trivial * (1 + 1e-6))[defined].float().mean()),
            float((bound_r > 0)[defined].float().mean()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--corpus", default="python-reference")
    parser.add_argument("--windows", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=16)
    parser.add_argument("--layers", type=int, nargs="+", default=None,
                        help="report these layers only (default: every layer; a sliding-window layer is measured over "
                             "each query's visible sources, docs/metrics.md#sliding-windows)")
    parser.add_argument("--query-windows", type=int, default=4,
                        help="windows whose every query C11 checks (all-query work grows with the square of --seq-len)")
    args = parser.parse_args()
    start = time.perf_counter()
    model = tlg.load_model(args.model)
    windows = make_windows(model, load_corpus(args.corpus), args.seq_len, args.windows, seed=0)
    res = only(tlg.analyze(model, windows.tokens, repeats=args.repeats, bootstrap=200).geometry, args.layers)
    print(f"## {args.model} — {args.corpus}, {windows.tokens.shape[0]} windows × {args.seq_len} tokens, "
          f"last query, N = {list(res.n)}{'' if args.layers is None else f', layers {args.layers}'} "
          f"({time.perf_counter() - start:.0f} s)\n")
    print(report(res))
    # C11 again with the sink excluded from the candidates and N listed out of order (repeats)
    ns = tuple(reversed(res.n)) + (res.n[1],)
    res_nosink = only(tlg.analyze(model, windows.tokens, ns, exclude_sink=True, repeats=0, bootstrap=20,
                                  progress=False).geometry, args.layers)
    violations, checks = certificate_violations(res_nosink)
    print(f"C11, sink excluded, N = {list(ns)}: bound above measurement in {violations} of {checks} checks.")
    for exclude_sink in (False, True):
        violations, checks = per_query_violations(model, windows.tokens[:args.query_windows], ns, exclude_sink,
                                                  args.layers)
        print(f"C11, every query of {args.query_windows} windows, exclude_sink={exclude_sink}, N = {list(ns)}: bound above "
              f"measurement in {violations} of {checks} (query, head, N) checks.")


def only(res: tlg.GeometryResult, layers: list[int] | None) -> tlg.GeometryResult:
    """The result restricted to ``layers`` (all: None)."""
    if layers is None:
        return res
    return dataclasses.replace(res, per_sequence={name: values[:, layers] for name, values in res.per_sequence.items()})


def per_query_violations(model, tokens: torch.Tensor, ns: tuple[int, ...], exclude_sink: bool,
                         layers: list[int] | None = None) -> tuple[int, int]:
    """Sink-aware bounds and inversion certificates against the measurement, query by query (all queries)."""
    counts = [0, 0]

    def check(layer: int, att: tlg.capture.LayerAttention) -> None:
        kwargs = {"queries": "all", "exclude_sink": exclude_sink, **att.visibility}
        sep = tlg.separability(att.pattern, att.kv_values, ns, **kwargs)
        bound = tlg.sink_aware_bounds(att.pattern, att.kv_values, ns, **kwargs)
        cert_p, cert_r = tlg.inversion_bounds(sep)
        defined = sep.defined
        for low, measured in ((bound.precision, sep.precision), (bound.recall, sep.recall),
                              (cert_p, sep.precision), (cert_r, sep.recall)):
            counts[0] += int((low[defined] > measured[defined]).sum())
            counts[1] += int(defined.sum())

    tlg.capture.stream_layers(model, tokens, check, layers=layers)
    return counts[0], counts[1]


if __name__ == "__main__":
    main()
