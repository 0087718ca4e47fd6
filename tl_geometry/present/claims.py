"""The claims of docs/metrics.md#claims measured on one run: the paper's statement beside our value.

``claims_table(analysis, pruning=..., scan=...)`` returns one row per claim with the measured
value as text and ``holds`` (True / False / None when the run lacks the data). The rules that
decide ``holds`` are stated in each row's ``rule``, so a reader can disagree with them.
"""

from __future__ import annotations

from typing import Any

import torch

from ..heads import head_name
from ..label.taxonomy import REGIMES
from ..run.results import Analysis

__all__ = ["PAPER_CLAIMS", "claims_table"]

PAPER_CLAIMS = {
    "C1": "top-N sets are more separable than random sets of the same size, most at small and intermediate N",
    "C2": "sink value norm 3–10× smaller than non-sink",
    "C3": "sink value direction negatively aligned with non-sink values",
    "C4": "a selected sink lowers F_N, often by half",
    "C5": "retrievers are a minority (5.8–17.2%)",
    "C6": "dominant regime (mixer or reset) is a property of the architecture, stable across corpora",
    "C7": "mixer heads align with the sink, retriever heads with the current token",
    "C8": "the taxonomy helps head removal at moderate retention, not always under aggressive pruning",
    "C9": "single critical heads exist whose removal alone causes a failure",
    "C10": "strongest non-trivial separability at small N",
    "C11": "the inversion and sink-aware bounds hold as certificates",
}


def _model_mean(geo, name: str) -> torch.Tensor:
    """Heads and layers within each sequence, then sequences (docs/metrics.md#random-baseline): ``[n]`` or scalar."""
    return geo.per_sequence[name].nanmean((1, 2)).nanmean(0)


def _row(cid: str, measured: str, holds: bool | None, rule: str) -> dict[str, Any]:
    return {"id": cid, "paper": PAPER_CLAIMS[cid], "measured": measured, "holds": holds, "rule": rule}


def claims_table(analysis: Analysis, *, pruning=None, scan: torch.Tensor | None = None,
                 other_taxonomies: dict | None = None) -> list[dict[str, Any]]:
    """Rows ``{id, paper, measured, holds, rule}`` for C1–C11 from one run (and optional
    pruning curves, single-head scan and taxonomies of the same model on other corpora)."""
    geo, tax = analysis.geometry, analysis.taxonomy
    gap_row, peak = _gap_claim(geo)
    rows = [gap_row, *_taxonomy_claims(tax, other_taxonomies), _pruning_claim(pruning), _scan_claim(scan, tax),
            _row("C10", f"largest top-N − random gap at N={peak}", peak <= 8, "peak at N ≤ 8")]
    if geo.has_sink:
        rows += [*_sink_claims(geo), _alignment_claim(geo, tax), _bounds_claim(geo, peak)]
    return sorted(rows, key=lambda row: int(row["id"][1:]))


def _gap_claim(geo) -> tuple[dict[str, Any], int]:
    """C1 (top-N above random at every N > 1), and the N of the largest gap (C10's)."""
    ns = list(geo.n)
    gap = _model_mean(geo, "f_top") - _model_mean(geo, "f_random")
    above = [n for n, g in zip(ns, gap.tolist(), strict=True) if n > 1]
    peak = ns[int(gap.nan_to_num(-9).argmax())]
    gaps = ", ".join(f"N={n}: {g:+.3f}" for n, g in zip(ns, gap.tolist(), strict=True) if n > 1)
    return _row("C1", f"F_N top-N − random: {gaps}; largest at N={peak}",
                bool(all(g > 0 for n, g in zip(ns, gap.tolist(), strict=True) if n > 1)) if above else None,
                "gap > 0 at every N > 1"), peak


def _sink_claims(geo) -> list[dict[str, Any]]:
    """C2 (norm ratio), C3 (negative sink cosine), C4 (F lower with the sink selected)."""
    ns = list(geo.n)
    ratio = geo.mean("norm_ratio").flatten()
    cosine = geo.mean("sink_cosine").flatten()
    negative = float((cosine < 0).float().mean())
    f_sel, f_unsel = _model_mean(geo, "f_sink_selected"), _model_mean(geo, "f_sink_unselected")
    parts = [f"N={n}: {a:.2f} vs {b:.2f}" for n, a, b in zip(ns, f_sel.tolist(), f_unsel.tolist(), strict=True) if n > 1][:3]
    lower = [a < b for n, a, b in zip(ns, f_sel.tolist(), f_unsel.tolist(), strict=True) if n > 1]
    return [_row("C2", f"median non-sink/sink norm ratio {ratio.nanmedian():.2f} "
                       f"({(((ratio >= 3) & (ratio <= 10)).float().mean() * 100):.0f}% of heads in [3, 10])",
                 bool(3 <= ratio.nanmedian() <= 10), "median ratio in [3, 10]"),
            _row("C3", f"{negative:.0%} of heads have a negative mean sink cosine (median {cosine.nanmedian():+.3f})",
                 negative > 0.5, "more than half of the heads negative"),
            _row("C4", "F_N with the sink selected vs not: " + "; ".join(parts),
                 bool(lower and all(lower)), "lower at every N > 1 (the size is reported, not tested)")]


def _taxonomy_claims(tax, other_taxonomies: dict | None) -> list[dict[str, Any]]:
    """C5 (the retriever share) and C6 (labels stable across corpora)."""
    fractions = tax.fractions().iloc[-1]
    retriever = float(fractions["retriever"])
    shares = _row("C5", f"retrievers {retriever:.1%}, mixers {float(fractions['mixer']):.1%}, "
                        f"resets {float(fractions['reset']):.1%}", 0.058 <= retriever <= 0.172,
                  "retriever share in [5.8%, 17.2%]")
    dominant = max(("mixer", "reset"), key=lambda r: float(fractions[r]))
    if not other_taxonomies:
        return [shares, _row("C6", f"dominant: {dominant} (stability needs a second corpus: run again with --corpus "
                                   "lee-news)", None, "κ > 0.6 against every other corpus")]
    agreements = {name: tax.agreement(other) for name, other in other_taxonomies.items()}
    text = "; ".join(f"vs {name}: {a['agreement']:.0%} equal labels, κ={a['kappa']:.2f}" for name, a in agreements.items())
    return [shares, _row("C6", f"dominant: {dominant}; {text}", all(a["kappa"] > 0.6 for a in agreements.values()),
                         "κ > 0.6 against every other corpus")]


def _alignment_claim(geo, tax) -> dict[str, Any]:
    """C7: mixers' aggregates closer to the sink, retrievers' to the current token."""
    ns = list(geo.n)
    sink, current = geo.mean("align_sink"), geo.mean("align_current")
    at = ns.index(next((n for n in ns if n > 1), ns[0]))
    means = {}
    for i, regime in enumerate(REGIMES):
        chosen = tax.label_ids == i
        means[regime] = (float(sink[chosen][:, at].nanmean()) if chosen.any() else float("nan"),
                         float(current[chosen][:, at].nanmean()) if chosen.any() else float("nan"))
    text = "; ".join(f"{r}: sink {s:+.2f}, current {c:+.2f}" for r, (s, c) in means.items())
    holds = means["mixer"][0] > means["retriever"][0] and means["retriever"][1] > means["mixer"][1]
    return _row("C7", f"cos(s_N, v_0) and cos(s_N, v_t) at N={ns[at]}: {text}",
                None if any(v != v for pair in means.values() for v in pair) else bool(holds),
                "mixers closer to the sink and retrievers closer to the current token than each other")


def _pruning_claim(pruning) -> dict[str, Any]:
    """C8: pruning by the taxonomy no worse than the baselines at moderate retention."""
    if pruning is None:
        return _row("C8", "not measured in this run (tl-geometry prune)", None, "—")
    if "taxonomy" not in set(pruning["method"]):
        return _row("C8", "not measured: the pruning curves have no taxonomy ranking", None, "—")
    table = pruning.pivot(index="method", columns="retention", values="delta_nll")
    moderate = [r for r in table.columns if 0.5 <= r < 1.0]
    wins = {r: table.loc["taxonomy", r] <= table.drop(index="taxonomy")[r].min() for r in table.columns if r < 1}
    text = "; ".join(f"keep {r:g}: taxonomy {table.loc['taxonomy', r]:+.3f} vs best other "
                     f"{table.drop(index='taxonomy')[r].min():+.3f}" for r in sorted(table.columns, reverse=True) if r < 1)
    return _row("C8", text, bool(moderate and all(wins[r] for r in moderate)),
                "taxonomy no worse than every baseline at retention 0.5–0.9")


def _scan_claim(scan: torch.Tensor | None, tax) -> dict[str, Any]:
    """C9: one head whose removal alone at least doubles the loss."""
    if scan is None:
        return _row("C9", "not measured in this run (tl-geometry prune)", None, "—")
    top = scan.flatten().nan_to_num(-1).argmax()
    layer, head = divmod(int(top), scan.shape[1])
    worst = float(scan[layer, head])
    return _row("C9", f"most critical head {head_name(layer, head)} ({tax.labels[layer, head]}): ΔNLL {worst:+.3f}; "
                      f"median head {float(scan.flatten().nanmedian()):+.4f}", worst >= 1.0,
                "one head whose removal alone at least doubles the loss (ΔNLL ≥ 1)")


def _bounds_claim(geo, peak: int) -> dict[str, Any]:
    """C11: no certificate above its measurement."""
    ns = list(geo.n)
    checks, violations = 0, 0
    for bound, measured in (("precision_bound", "precision_top"), ("recall_bound", "recall_top"),
                            ("precision_certificate", "precision_top"), ("recall_certificate", "recall_top")):
        defined = ~torch.isnan(geo.per_sequence[bound])
        checks += int(defined.sum())
        violations += int((geo.per_sequence[bound] > geo.per_sequence[measured] + 1e-6).sum())
    return _row("C11", f"bound above measurement in {violations} of {checks} (window, head, N) checks; "
                       f"sink-aware P bound {float(_model_mean(geo, 'precision_bound')[ns.index(peak)]):.3f} vs "
                       f"measured {float(_model_mean(geo, 'precision_top')[ns.index(peak)]):.3f} at N={peak}",
                violations == 0, "no violation")
