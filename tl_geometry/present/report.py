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

import html
import json
import math
import platform
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io
import torch

from ..errors import TLGeometryError
from ..heads import layer_spans
from ..io import atomic_path
from ..run.compare import Comparison
from ..run.results import Analysis
from ..run.run_folder import RunFolder
from . import plots
from .claims import claims_table

__all__ = ["build_report", "write_report", "build_comparison", "write_comparison", "script_safe_json", "derived_results"]


def script_safe_json(obj: Any) -> str:
    """JSON that can sit inside ``<script>``: ``<``, ``>``, ``&`` and U+2028/9 are unicode escapes."""
    text = obj if isinstance(obj, str) else json.dumps(obj, allow_nan=False, default=str)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                         ("\u2029", "\\u2029")):
        text = text.replace(char, escape)
    return text


def _figure_block(fig: go.Figure, index: int, head_map: bool = False) -> str:
    div = f"tlg-fig-{index}"
    payload = script_safe_json(plotly.io.to_json(fig, validate=False))
    click = ""
    if head_map:
        click = (f"document.getElementById('{div}').on('plotly_click', function (e) {{"
                 "if (e.points.length) { var p = e.points[0]; showHead('L' + p.y + 'H' + p.x); } });")
    return (f'<div class="tlg-plot" id="{div}"></div>\n<script>(function () {{ var fig = {payload};'
            f" Plotly.newPlot('{div}', fig.data, fig.layout, {{responsive: true}}).then(function () {{ {click} }});"
            " })();</script>")


def _versions(settings: dict) -> dict[str, str]:
    import torch

    from .. import __version__

    return {"tl_geometry": __version__, "transformer_lens": str(settings.get("transformer_lens", "?")),
            "torch": torch.__version__, "plotly": plotly.__version__, "python": platform.python_version()}


def _table(rows: list[dict], columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(row.get(c, '')))}</td>" for c in columns) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


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
    drilldowns: list[go.Figure] | None = None,
) -> str:
    """The report as an HTML string: settings, claims C1–C11 beside the paper's, every figure."""
    figures = _figures(analysis, pruning, scan, topn, streaming, drilldowns)
    claims = claims_table(analysis, pruning=pruning, scan=scan)
    for row in claims:
        row["holds"] = {True: "yes", False: "no", None: "—"}[row["holds"]]
    settings = dict(analysis.geometry.settings)
    setting_rows = [{"setting": k, "value": json.dumps(v) if isinstance(v, dict | list) else v}
                    for k, v in settings.items()]
    setting_rows += [{"setting": f"version: {k}", "value": v} for k, v in _versions(settings).items()]
    heads = analysis.heads_table()
    if scan is not None:
        heads["delta_nll_alone"] = scan.reshape(-1).double().numpy()
    head_rows = {row["name"]: {k: _clean(v) for k, v in row.items()} for row in heads.to_dict(orient="records")}
    blocks = "\n".join(f"<h2>{html.escape(name)}</h2>\n{_figure_block(fig, i, is_map)}"
                       for i, (name, fig, is_map) in enumerate(figures))
    body = f"""<h2>Run settings</h2>
{_table(setting_rows, ["setting", "value"])}
{_notes(analysis)}<h2>Claims of the paper and what this run measured</h2>
{_table(claims, ["id", "paper", "measured", "holds", "rule"])}
{_types_section(analysis)}
<div id="tlg-head"><b id="tlg-head-name"></b><table id="tlg-head-table"></table></div>
<script>
var TLG_HEADS = {script_safe_json(head_rows)};
{_SHOW_HEAD}
</script>
{blocks}"""
    return _page(title, body)


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


def _figures(analysis: Analysis, pruning, scan, topn, streaming, drilldowns) -> list[tuple[str, go.Figure, bool]]:
    """The report's figures in order: (heading, figure, whether it is a clickable head map)."""
    geo = analysis.geometry
    figures: list[tuple[str, go.Figure, bool]] = [
        ("Head regimes (click a head for its numbers)", plots.head_map(analysis, "regime", delta_nll=scan), True),
        ("Top-N minus random F_N per head", plots.head_map(analysis, "gap", delta_nll=scan), True),
        ("Separability against N", plots.separability_curves(analysis), False),
    ]
    if "precision_bound" in geo.per_sequence:
        figures.append(("Certified precision P̲_N per head (the largest of Theorems 1–4; trivial: N/(t+1))",
                        plots.head_map(analysis, "precision_bound", n=2 if 2 in geo.n else None, delta_nll=scan),
                        True))
    if geo.has_sink:
        figures.append(("The attention sink", plots.sink_plots(analysis), False))
    figures.append(("Regimes per layer", plots.regime_fractions(analysis.taxonomy), False))
    if scan is not None:
        figures.append(("Single-head removal", plots.head_map(analysis, "delta_nll", delta_nll=scan), True))
    if pruning is not None:
        figures.append(("Pruning curves", plots.pruning_plot(pruning), False))
    if topn:
        figures.append(("Top-N attention deletion", plots.topn_plot(topn), False))
    if streaming is not None:
        figures.append(("Streaming kv heads (sink + recent window), by order", plots.streaming_plot(streaming), False))
    return figures + [("Inside one head", fig, False) for fig in drilldowns or []]


def _types_section(analysis: Analysis) -> str:
    """Regimes against TransformerLens's head types, where the run has them."""
    if analysis.head_types is None:
        return ""
    crosstab = analysis.head_types.crosstab(analysis.taxonomy).reset_index()
    crosstab.columns = [str(c) for c in crosstab.columns]
    return ("<h2>Regimes against TransformerLens's head types</h2>\n<p>Heads counted by regime and by the "
            "type whose detect_head score (on BOS + a repeated random sequence) is at least half of what a "
            "head of that type reaches; see docs/metrics.md, \"Familiar head types\".</p>\n"
            + _table(crosstab.to_dict(orient="records"), list(crosstab.columns)))


def _notes(analysis: Analysis) -> str:
    """What was not measurable, and what the queries saw (sliding windows, BOS)."""
    reasons = analysis.geometry.not_measurable()
    notes = "" if not reasons else "<h2>Not measurable</h2>\n<ul>" + "".join(
        f"<li>{html.escape(reason)}</li>" for reason in reasons) + "</ul>\n"
    seen = attention_notes(analysis)
    return notes + ("" if not seen else "<h2>What the queries saw</h2>\n<ul>" + "".join(
        f"<li>{html.escape(line)}</li>" for line in seen) + "</ul>\n")


def _page(title: str, body: str) -> str:
    """A self-contained HTML page (plotly inlined) around ``body``; ``title`` is escaped here."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em 2em; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }}
td, th {{ border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }}
th {{ background: #f3f3f3; }}
#tlg-head {{ position: fixed; right: 1em; top: 1em; width: 22em; max-height: 90vh; overflow: auto; background: #fff;
  border: 1px solid #999; padding: 0.5em; font-size: 0.8em; display: none; }}
.tlg-plot {{ min-height: 360px; }}
</style>
<script>{plotly.offline.get_plotlyjs()}</script>
</head><body>
<h1>{html.escape(title)}</h1>
{body}
</body></html>
"""


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
    parts = [_table(rows, ["", "value"]), "<h2>Regime shares</h2>",
             _table([{k: (f"{v:.1%}" if isinstance(v, float) else v) for k, v in row.items()}
                     for row in fractions.to_dict(orient="records")], list(fractions.columns))]
    if c.head_by_head:
        counts, shares = c.transition_table(), c.transition_table(shares=True)
        table = [{"": index, **{col: f"{int(counts.loc[index, col])} ({shares.loc[index, col]:.0%})"
                                for col in counts.columns}} for index in counts.index]
        parts += ["<h2>Regime transitions (rows: first, columns: second)</h2>", _table(table, ["", *counts.columns])]
        changed = c.changed_heads()
        columns = [col for col in changed.columns if col in ("name", "changed") or col.startswith(("regime_", "delta_gap"))]
        parts += ["<h2>Heads that changed most</h2>",
                  _table([{k: (f"{v:+.3f}" if isinstance(v, float) else v) for k, v in row.items()}
                          for row in changed[columns].to_dict(orient="records")], columns)]
    parts += [f"<h2>{html.escape(name)}</h2>\n{_figure_block(fig, i)}"
              for i, (name, fig) in enumerate(plots.comparison_figures(c))]
    return _page(title, "\n".join(parts))


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
