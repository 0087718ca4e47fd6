"""Self-contained HTML pages (plotly.js embedded, open offline): the report of one analysis and the
comparison of two.

Everything that comes from the model, the corpus or the user (token strings, corpus names,
paths) is untrusted: it is HTML-escaped where it enters markup, and figure JSON is embedded with
``<``, ``>`` and ``&`` written as JSON unicode escapes, so no string can close a ``<script>`` or
open a tag. Clicking a head on a head map shows its row of the heads table in a side panel.

Example:
    >>> html_text = build_report(analysis, title="SmolLM2 on python-reference")   # doctest: +SKIP
    >>> write_report(analysis, "runs/x/report.html")                              # doctest: +SKIP
"""

from __future__ import annotations

import functools
import json
import math
import platform
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io
import torch

from ..errors import TLGeometryError
from ..heads import layer_spans, parse_head
from ..intervene.duo_attention import DUO_ATTENTION_FOLDER, DuoAttentionPattern
from ..io import atomic_path
from ..label.taxonomy import REGIME_FAMILIAR, REGIME_MEANING, REGIMES
from ..run.compare import Comparison
from ..run.results import Analysis
from ..run.run_folder import RunFolder
from . import plots
from .claims import claims_table
from .style import REGIME_COLORS

__all__ = ["build_report", "write_report", "build_comparison", "write_comparison", "script_safe_json", "derived_results"]


def script_safe_json(obj: Any) -> str:
    """JSON that can sit inside ``<script>``: ``<``, ``>``, ``&`` and U+2028/9 are unicode escapes."""
    text = obj if isinstance(obj, str) else json.dumps(obj, allow_nan=False, default=str)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                         ("\u2029", "\\u2029")):
        text = text.replace(char, escape)
    return text


# A click on a head map's cell shows the head's row of the heads table (showHead, in the page).
_CLICK = ("document.getElementById('{plot_id}').on('plotly_click', function (e) {"
          " if (e.points.length) { var p = e.points[0]; showHead('L' + p.y + 'H' + p.x); } });")


def _figure_html(fig: go.Figure, index: int, head_map: bool = False) -> str:
    """A figure's ``<div>`` and script (plotly.js is in the page once; plotly escapes the JSON)."""
    return plotly.io.to_html(fig, full_html=False, include_plotlyjs=False, div_id=f"tlg-fig-{index}",
                             config={"responsive": True}, post_script=_CLICK if head_map else None, validate=False)


def _frame_html(frame: pd.DataFrame) -> str:
    """A table as HTML, every cell escaped (pandas' ``to_html``)."""
    return frame.to_html(index=False, escape=True, border=0, na_rep="—")


@functools.cache
def _templates() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.PackageLoader("tl_geometry.present", "templates"), autoescape=True,
                              trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)


def _render(template: str, **context) -> str:
    """A page from its template: every value autoescaped, figures and tables marked safe there."""
    return _templates().get_template(template).render(plotly_js=plotly.offline.get_plotlyjs(), **context)


def _versions(settings: dict) -> dict[str, str]:
    from .. import __version__

    return {"tl_geometry": __version__, "transformer_lens": str(settings.get("transformer_lens", "?")),
            "torch": torch.__version__, "plotly": plotly.__version__, "python": platform.python_version()}


def _clean(value: Any) -> Any:
    """A table cell as JSON reads it: NaN, inf and missing values (``pd.NA``) as null, numpy
    scalars as Python's (a flag stays a boolean)."""
    value = value.item() if isinstance(value, np.generic) else value
    if value is pd.NA or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return value


def attention_notes(analysis: Analysis) -> list[str]:
    """What the run's queries could see, in sentences: whether the windows start with BOS, and
    which layers attend within a sliding window (and how many of their votes had no sink in view)."""
    geo, tax = analysis.geometry, analysis.taxonomy
    lines = []
    without = geo.windows_without_bos
    if geo.bos_line() == "BOS unknown":
        lines.append("BOS unknown (no tokens or no BOS id): position 0 was taken as the sink.")
    elif without:
        lines.append(f"{len(without)} of {geo.window_ids.numel()} windows do not start with BOS (windows "
                     f"{', '.join(map(str, without[:8]))}{' …' if len(without) > 8 else ''}): their sink statistics "
                     "and mixer votes describe their first content token.")
    elif without is not None:
        lines.append("Every window starts with BOS: position 0 is the sink.")
    windows = {int(layer): int(w) for layer, w in (geo.settings.get("sliding_windows") or {}).items()}
    for width in sorted(set(windows.values())):
        layers = sorted(layer for layer, w in windows.items() if w == width)
        share = "" if tax.sinkless is None else (
            f"; {float(tax.sinkless[layers].sum() / tax.votes[layers].sum().clamp_min(1)):.0%} of their votes came "
            "from such rows")
        lines.append(f"{layer_spans(layers)} attend within a sliding window of {width} positions: a query t sees "
                     f"t − {width - 1} .. t, and past position {width - 1} no sink (no sink statistics, no sink vote)"
                     f"{share}.")
    return lines


def build_report(
    analysis: Analysis,
    *,
    title: str = "tl_geometry report",
    pruning=None,
    scan=None,
    topn: list | None = None,
    streaming=None,
    duo_attention=None,
    drilldowns: list[go.Figure] | None = None,
) -> str:
    """The report as an HTML string. Its first screen answers which heads do what: the regime map,
    what each label means, the surest heads of each regime and the uncertain ones; then every
    figure, each drill-down headed by its head in words; run settings and the paper's claims last,
    folded."""
    figures = _figures(analysis, pruning, scan, topn, streaming, drilldowns) + _pattern_figure(analysis, duo_attention)
    claims = pd.DataFrame(claims_table(analysis, pruning=pruning, scan=scan))
    claims["holds"] = claims["holds"].map({True: "yes", False: "no", None: "—"})
    settings = dict(analysis.geometry.settings)
    setting_rows = [{"setting": k, "value": json.dumps(v) if isinstance(v, dict | list) else v} for k, v in settings.items()]
    setting_rows += [{"setting": f"version: {k}", "value": v} for k, v in _versions(settings).items()]
    heads = analysis.heads_table(all_columns=True)
    if scan is not None:
        heads["delta_nll_alone"] = scan.reshape(-1).double().numpy()
    head_rows = {row["name"]: {k: _clean(v) for k, v in row.items()} for row in heads.to_dict(orient="records")}
    uncertain = analysis.uncertain_heads()
    regimes = [{"name": r, "meaning": REGIME_MEANING[r], "familiar": REGIME_FAMILIAR.get(r), "color": REGIME_COLORS[r]}
               for r in REGIMES]
    types = None
    if analysis.head_types is not None:
        crosstab = analysis.head_types.crosstab(analysis.taxonomy).reset_index()
        types = _frame_html(crosstab.set_axis([str(c) for c in crosstab.columns], axis=1))
    return _render(
        "report.html.j2", title=title, basis=f"Labels from {analysis.taxonomy.basis}.", regimes=regimes,
        head_map=_figure_html(plots.head_map(analysis, "regime", delta_nll=scan).update_layout(width=640), 0, head_map=True),
        glance=_frame_html(analysis.heads_at_a_glance()), uncertain=_uncertain_line(uncertain, analysis),
        notes=[f"Not measurable (NaN): {reason}" for reason in analysis.geometry.not_measurable()]
        + attention_notes(analysis), types=types,
        heads_json=script_safe_json(head_rows), show_head=_SHOW_HEAD,
        figures=[{"heading": heading, "caption": caption, "html": _figure_html(fig, i, is_map)}
                 for i, (heading, caption, fig, is_map) in enumerate(figures, start=1)],
        settings=_frame_html(pd.DataFrame(setting_rows)), claims=_frame_html(claims[["id", "paper", "measured", "holds", "rule"]]))


def _uncertain_line(uncertain: list[str], analysis: Analysis) -> str:
    """Which labels could flip on other text, in a sentence."""
    if not uncertain:
        return "Every label is sure: its winner's 95% interval stays above the runner-up's."
    shown = ", ".join(uncertain[:12]) + (f" and {len(uncertain) - 12} more" if len(uncertain) > 12 else "")
    return (f"{len(uncertain)} of {analysis.taxonomy.label_ids.numel()} labels are uncertain (could flip on other "
            f"text): {shown}. Analyse more text, or the text of your task, before relying on them.")


# The head panel: a click on a head map's cell shows the head's row of the heads table.
_SHOW_HEAD = """function showHead(name) {
  var row = TLG_HEADS[name]; if (!row) return;
  var panel = document.getElementById('tlg-head'); panel.style.display = 'block';
  document.getElementById('tlg-head-name').textContent = name;
  var table = document.getElementById('tlg-head-table'); table.textContent = '';
  Object.keys(row).forEach(function (key) {
    var tr = table.insertRow(); tr.insertCell().textContent = key;
    var value = row[key]; tr.insertCell().textContent = (typeof value === 'number') ? value.toPrecision(4) :
      (value === null ? 'not measurable' : String(value));
  });
}"""

# What a drill-down of each regime shows, where its numbers could look contradictory.
_DRILLDOWN_CAPTIONS = {
    "retriever": "The current token's contribution is the largest. The margin (nearest unselected distance minus "
                 "farthest selected one) can be negative while the certificate holds: the certificate bounds the "
                 "precision and recall of the top-N set, not whether one ball holds it exactly.",
    "mixer": "The sink's contribution dwarfs the others, so s_N sits near it and the other sources lie about equally "
             "far away: the top-N set is barely separable (P near N/(t+1), margin near 0). That is what a mixer is.",
    "reset": "Another token's contribution is the largest (for a previous-token head, the token before the query).",
}


def _drilldown_figures(analysis: Analysis, drilldowns: list[go.Figure]) -> list[tuple[str, str, go.Figure, bool]]:
    """Each drill-down headed by its head and regime in words (``layout.meta``: head and regime;
    figures saved without them keep a plain heading)."""
    entries = []
    for fig in drilldowns:
        meta = fig.layout.meta if isinstance(fig.layout.meta, dict) else {}
        try:
            layer, head = parse_head(meta.get("head"), *analysis.taxonomy.shape)
        except TLGeometryError:
            entries.append(("One head up close", "", fig, False))
            continue
        caption = f"{analysis.head_profile((layer, head))}. {_DRILLDOWN_CAPTIONS[analysis.taxonomy.labels[layer, head]]}"
        entries.append((analysis.taxonomy.describe_head(layer, head), caption, fig, False))
    return entries


def _figures(analysis: Analysis, pruning, scan, topn, streaming, drilldowns) -> list[tuple[str, str, go.Figure, bool]]:
    """The report's figures after the first screen's head map, in order: (heading, caption, figure,
    whether it is a clickable head map)."""
    geo = analysis.geometry
    figures: list[tuple[str, str, go.Figure, bool]] = [
        ("How separable the top-N tokens are", "F_N of the N most attended tokens against N random ones, in value "
         "space: above the dashed line, attention picks tokens whose contributions cluster apart from the rest.",
         plots.separability_curves(analysis), False),
        ("Top-N minus random F_N per head", "", plots.head_map(analysis, "gap", delta_nll=scan), True),
    ]
    if "precision_bound" in geo.per_sequence:
        figures.append(("Certified precision per head", "A lower bound the measured precision cannot go below, proved "
                        "in floating point (the largest of Theorems 1–4); trivial where it equals N/(t+1).",
                        plots.head_map(analysis, "precision_bound", n=2 if 2 in geo.n else None, delta_nll=scan), True))
    if geo.has_sink:
        figures.append(("The attention sink", "", plots.sink_plots(analysis), False))
    figures.append(("Regimes per layer", "", plots.regime_fractions(analysis.taxonomy), False))
    if scan is not None:
        figures.append(("Single-head removal", "", plots.head_map(analysis, "delta_nll", delta_nll=scan), True))
    if pruning is not None:
        figures.append(("Pruning curves", "", plots.pruning_plot(pruning), False))
    if topn:
        figures.append(("Top-N attention deletion", "", plots.topn_plot(topn), False))
    if streaming is not None:
        figures.append(("Streaming kv heads (sink + recent window), by order", "", plots.streaming_plot(streaming), False))
    return figures + _drilldown_figures(analysis, drilldowns or [])


def _pattern_figure(analysis: Analysis, pattern) -> list[tuple[str, str, go.Figure, bool]]:
    """The exported DuoAttention pattern as a head map (each query head shows its kv head's score)."""
    if pattern is None:
        return []
    caption = (f"{DUO_ATTENTION_FOLDER}/ holds the {pattern.order} order in DuoAttention's layout (sink {pattern.sink_size}, "
               f"recent window {pattern.recent_size}): kvpress's DuoAttentionPress with head_compression_ratio r streams the "
               "kv heads scored lowest, the ones this run streamed at fraction r.")
    fig = plots.head_map(analysis, pattern.scores, title=f"DuoAttention score ({pattern.order} order; low: streamed first)")
    return [("Streaming heads exported for kvpress", caption, fig, True)]


def build_comparison(comparison: Comparison, *, title: str | None = None) -> str:
    """The comparison of two analyses as an HTML page: what was compared, agreement and κ, the
    transition matrix, the regime shares, the heads that changed most, and every figure."""
    c = comparison
    title = title or f"tl_geometry: {c.names[0]} vs {c.names[1]}"
    rows = [{"": "compared", "value": c.note}]
    if c.head_by_head:
        rows += [{"": "label agreement", "value": f"{c.agreement:.3f}"}, {"": "Cohen's κ", "value": f"{c.kappa:.3f}"}]
    for name, analysis in zip(c.names, (c.a, c.b), strict=True):
        settings = analysis.geometry.settings
        rows.append({"": name, "value": f"{settings.get('model', '?')} on {settings.get('corpus', '?')}, "
                                        f"{settings.get('n_windows', '?')} windows × {settings.get('seq_len', '?')} tokens"})
    fractions = c.fractions().reset_index(names="regime")
    sections = [{"heading": "Regime shares", "html": _frame_html(fractions.map(
        lambda v: f"{v:.1%}" if isinstance(v, float) else v))}]
    if c.head_by_head:
        counts, shares = c.transition_table(), c.transition_table(shares=True)
        table = pd.DataFrame([{"": index, **{col: f"{int(counts.loc[index, col])} ({shares.loc[index, col]:.0%})"
                                             for col in counts.columns}} for index in counts.index])
        changed = c.changed_heads()
        columns = [col for col in changed.columns if col in ("name", "changed") or col.startswith(("regime_", "delta_gap"))]
        sections += [{"heading": "Regime transitions (rows: first, columns: second)", "html": _frame_html(table)},
                     {"heading": "Heads that changed most", "html": _frame_html(changed[columns].map(
                         lambda v: f"{v:+.3f}" if isinstance(v, float) else v))}]
    figures = [{"heading": name, "html": _figure_html(fig, i)} for i, (name, fig) in enumerate(plots.comparison_figures(c))]
    return _render("comparison.html.j2", title=title, overview=_frame_html(pd.DataFrame(rows)), sections=sections,
                   figures=figures)


def write_comparison(comparison: Comparison, path: str | Path, **kwargs) -> Path:
    """Write :func:`build_comparison` to ``path`` atomically and return the path."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text(build_comparison(comparison, **kwargs), encoding="utf-8")
    return path


def derived_results(run: RunFolder, analysis: Analysis) -> tuple[dict[str, Any], dict[str, str]]:
    """The results derived from ``analysis`` in its run folder, as :func:`build_report` takes them
    (``pruning`` DataFrame, ``scan`` ``[layer, head]`` tensor, ``topn`` list of ``TopNDeletion``,
    ``streaming`` :class:`~tl_geometry.StreamingCurve`), and the tables present but left out, with why."""
    from ..intervene.pruning import TopNDeletion
    from ..intervene.streaming import StreamingCurve

    tables, left_out = run.read_derived(analysis.geometry.settings.get("run_id"), tuple(analysis.taxonomy.shape))
    extras: dict[str, Any] = {}
    if "pruning.csv" in tables:
        extras["pruning"] = tables["pruning.csv"]
    if "single_head_scan.csv" in tables:
        extras["scan"] = _scan_tensor(run.path / "single_head_scan.csv", tables["single_head_scan.csv"],
                                      analysis.taxonomy.shape)
    if "topn.csv" in tables:
        extras["topn"] = [TopNDeletion(tuple(part["n"]), torch.tensor(part["delta_nll"].tolist(), dtype=torch.float64),
                                       float("nan"), bool(renorm), {})
                          for renorm, part in tables["topn.csv"].groupby("renormalise")]
    if "streaming.csv" in tables:
        extras["streaming"] = StreamingCurve.from_dataframe(tables["streaming.csv"])
    pattern_folder = run.path / DUO_ATTENTION_FOLDER
    if pattern_folder.is_dir():  # damaged: one line (DuoAttentionPattern.load); another analysis's: left out
        pattern = DuoAttentionPattern.load(pattern_folder)
        if pattern.settings.get("run_id") == analysis.geometry.settings.get("run_id"):
            extras["duo_attention"] = pattern
        else:
            left_out[f"{DUO_ATTENTION_FOLDER}/"] = "computed from another analysis: rerun tl-geometry stream"
    return extras, left_out


def _scan_tensor(path: Path, frame, shape: tuple[int, int]) -> torch.Tensor:
    """The ``[layer, head]`` ΔNLL of a scan table, refused when its heads do not fit ``shape``."""
    scan = torch.full(shape, torch.nan)
    # Rows were checked as they were read (integers ≥ 0); torch.tensor copies pandas' read-only arrays.
    layers, heads = (torch.tensor(frame[c].tolist(), dtype=torch.long) for c in ("layer", "head"))
    values = torch.tensor(frame["delta_nll"].tolist(), dtype=torch.float64)
    if int(layers.max()) >= shape[0] or int(heads.max()) >= shape[1]:
        raise TLGeometryError(f"{path} does not fit this analysis's {shape[0]}×{shape[1]} heads: rerun tl-geometry prune")
    scan[layers, heads] = values.float()
    return scan


def write_report(analysis: Analysis, path: str | Path, **kwargs) -> Path:
    """Write :func:`build_report` to ``path`` atomically and return the path."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_text(build_report(analysis, **kwargs), encoding="utf-8")
    return path
