"""Interactive plotly figures of head geometry. Every function returns a ``plotly.graph_objects.Figure``.

Token strings and corpus text are untrusted: every string that reaches a figure from the model or
the corpus goes through :func:`safe_text` (HTML-escaped), since plotly renders hover and tick
text as pseudo-HTML.

Example:
    >>> res = tlg.analyze(model, tokens)                         # doctest: +SKIP
    >>> tlg.plots.head_map(res, color="regime").show()           # doctest: +SKIP
    >>> tlg.plots.head_map(res, color="gap", n=4).show()         # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ..errors import TLGeometryError
from ..heads import head_name, head_names
from ..label.head_types import HEAD_TYPES
from ..label.taxonomy import REGIMES, HeadTaxonomy, regime_gloss
from ..run.compare import Comparison
from ..run.results import Analysis
from .drilldown import head_drilldown, visible_token
from .job_plots import pruning_plot, streaming_plot, topn_plot
from .style import REGIME_COLORS, safe_text

__all__ = ["REGIME_COLORS", "safe_text", "visible_token", "head_map", "grid_figure", "separability_curves", "sink_plots", "regime_fractions",
           "pruning_plot", "streaming_plot", "head_drilldown", "topn_plot", "comparison_figures"]


def _n_index(res: Analysis, n: int | None) -> tuple[int, int]:
    ns = res.geometry.n
    if n is None:
        n = next((x for x in ns if x > 1), ns[0])
    if n not in ns:
        raise TLGeometryError(f"n={n} was not measured; have {list(ns)}.")
    return ns.index(n), n


def _head_hover(res: Analysis, n_at: int, importance: torch.Tensor | None) -> list[list[str]]:
    """Hover text of every head, ``[layer][head]``, with the metrics at the ``n_at``-th N."""
    geo, tax = res.geometry, res.taxonomy
    layers, heads = tax.shape
    f_top, f_random = geo.mean("f_top")[..., n_at], geo.mean("f_random")[..., n_at]
    if geo.has_sink:
        norm_ratio, sink_cosine = geo.mean("norm_ratio"), geo.mean("sink_cosine")
    types = res.head_types
    type_labels = types.labels() if types is not None else None
    uncertain = tax.label_uncertain
    rows = []
    for layer in range(layers):
        row = []
        for head in range(heads):
            shares = tax.shares[layer, head].tolist()
            text = (f"<b>{head_name(layer, head)}</b>: {regime_gloss(tax.labels[layer, head])}<br>"
                    f"votes: current {shares[0]:.2f}, sink {shares[1]:.2f}, other {shares[2]:.2f}"
                    f"{' (uncertain)' if uncertain[layer, head] else ''}<br>"
                    f"F_N={geo.n[n_at]}: top-N {f_top[layer, head]:.3f} vs random {f_random[layer, head]:.3f}")
            if geo.has_sink:
                text += (f"<br>sink norm ratio {norm_ratio[layer, head]:.2f}, "
                         f"sink cosine {sink_cosine[layer, head]:+.3f}")
            if types is not None:
                text += (f"<br>previous-token {types.previous_token[layer, head]:.2f}, duplicate "
                         f"{types.duplicate_token[layer, head]:.2f}, induction {types.induction[layer, head]:.2f}"
                         f" ({type_labels[layer, head].replace('_', '-')})")
            if importance is not None:
                text += f"<br>ΔNLL if removed {float(importance[layer, head]):+.4f}"
            row.append(text)
        rows.append(row)
    return rows


def _grid(values: torch.Tensor) -> list[list[float | None]]:
    """``[layer, head]`` values as nested lists, NaN as None (a gap in the heatmap)."""
    return [[None if v != v else v for v in row] for row in values.double().tolist()]


def _categorical_scale(colors: list[str]) -> list[list]:
    """A step colorscale: integer ``z = i`` (with ``zmin=-0.5``, ``zmax=k-0.5``) takes ``colors[i]``."""
    k = len(colors)
    return [[edge / k, color] for i, color in enumerate(colors) for edge in (i, i + 1)]


def grid_figure(values: torch.Tensor, hover: list[list[str]], *, title: str, colorbar: str,
                categories: list[str] | None = None, colors: list[str] | None = None,
                diverging: bool = False) -> go.Figure:
    """A layers × heads heatmap whose cells fill the grid. ``values`` ``[layer, head]``: category
    indices (with ``categories`` and their ``colors``: a legend, no colour bar) or a continuous
    metric (Viridis, or a diverging red-blue scale centred on 0). Every cell carries its head name
    ``L{l}H{h}`` as ``customdata`` and ``hover`` as its hover text."""
    layers, heads = values.shape
    names = head_names(layers, heads)
    trace: dict[str, Any] = {"z": _grid(values), "x": list(range(heads)), "y": list(range(layers)), "customdata": names,
                             "text": hover, "hoverinfo": "text", "xgap": 1, "ygap": 1, "name": title}
    fig = go.Figure()
    if categories is not None:
        fig.add_trace(go.Heatmap(**trace, colorscale=_categorical_scale(colors), zmin=-0.5,
                                 zmax=len(categories) - 0.5, showscale=False))
        for category, color in zip(categories, colors, strict=True):  # legend entries for the categories
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=category, showlegend=True,
                                     marker={"symbol": "square", "size": 12, "color": color}, hoverinfo="skip"))
    elif diverging:
        bound = float(values.abs().nan_to_num(0).max()) or 1.0
        fig.add_trace(go.Heatmap(**trace, colorscale="RdBu", zmid=0, zmin=-bound, zmax=bound,
                                 colorbar={"title": colorbar}))
    else:
        fig.add_trace(go.Heatmap(**trace, colorscale="Viridis", colorbar={"title": colorbar}))
    fig.update_layout(title=title, template="plotly_white", clickmode="event",
                      height=int(max(360, min(1200, 20 * layers + 160))),
                      xaxis={"title": "head", "dtick": 1 if heads <= 40 else None, "constrain": "domain",
                             "showgrid": False, "zeroline": False},
                      yaxis={"title": "layer", "autorange": "reversed", "dtick": 1 if layers <= 40 else None,
                             "showgrid": False, "zeroline": False},
                      # beside the grid, clear of the title and the N buttons above it
                      legend={"orientation": "v", "y": 1, "yanchor": "top", "x": 1.02, "xanchor": "left"})
    return fig


def _per_n_map(values: torch.Tensor, ns: tuple[int, ...], at: int, hovers: list[list[list[str]]], *, title: str,
               colorbar: str, diverging: bool) -> go.Figure:
    """A heatmap of ``values`` ``[layer, head, n]`` opening at the ``at``-th N, with one button per N
    (``hovers[i]`` the hover text at the i-th) and one colour range for every N, so the buttons
    compare like with like."""
    fig = grid_figure(values[..., at], hovers[at], title=title, colorbar=colorbar, diverging=diverging)
    if diverging:
        bound = float(values.abs().nan_to_num(0).max()) or 1.0
        fig.update_traces(zmin=-bound, zmax=bound, selector={"type": "heatmap"})
    else:
        fig.update_traces(zmin=float(values.nan_to_num(float("inf")).min()),
                          zmax=float(values.nan_to_num(float("-inf")).max()), selector={"type": "heatmap"})
    buttons = [{"label": f"N={n}", "method": "restyle", "args": [{"z": [_grid(values[..., i])], "text": [hovers[i]]}, [0]]}
               for i, n in enumerate(ns)]
    fig.update_layout(updatemenus=[{"type": "buttons", "direction": "right", "active": at, "buttons": buttons,
                                    "x": 0, "xanchor": "left", "y": 1.02, "yanchor": "bottom", "showactive": True}],
                      margin={"t": 110})
    return fig


def head_map(res: Analysis, color: str | torch.Tensor = "regime", n: int | None = None,
             delta_nll: torch.Tensor | None = None, *, title: str | None = None) -> go.Figure:
    """Layers × heads heatmap coloured by regime (categorical, each label with its meaning in the
    legend and the hover) or by a per-head metric (continuous scale; signed values diverge around 0).

    ``color``: ``"regime"``, any geometry metric (``"gap"``, ``"f_top"``, ``"norm_ratio"``, …),
    ``"delta_nll"`` with ``delta_nll`` given, a head type (``"previous_token"``,
    ``"duplicate_token"``, ``"induction"``) with head types attached, or your own ``[n_layers, n_heads]`` tensor (e.g. a
    TransformerLens head-detector score; flat, or one value per kv head under GQA:
    :meth:`~tl_geometry.Analysis.per_head`) shown under ``title``. A metric with an N axis gets one
    button per N, the figure opening at ``n``. Every cell carries its head name ``L{l}H{h}`` as
    ``customdata`` so a ``plotly_click`` handler can open its drill-down (the HTML report does).
    """
    n_at, n_value = _n_index(res, n)
    ns = res.geometry.n
    if delta_nll is not None:
        delta_nll = res.per_head(delta_nll, "delta_nll (single_head_scan's result)").tensor
    if isinstance(color, torch.Tensor):
        values = res.per_head(color, "a tensor to colour the heads by").tensor
        return grid_figure(values, _head_hover(res, n_at, delta_nll), title=title or "per-head values",
                           colorbar=title or "value", diverging=_signed(values))
    if color in HEAD_TYPES:
        if res.head_types is None:
            raise TLGeometryError(f"color={color!r} needs head types: res = res.with_head_types(tlg.head_types(model)).")
        label = color.replace("_", "-")
        return grid_figure(getattr(res.head_types, color).double(), _head_hover(res, n_at, delta_nll),
                           title=title or f"{label} score (TransformerLens detect_head, repeated random tokens)",
                           colorbar=label)
    if color == "regime":
        fig = grid_figure(res.taxonomy.label_ids, _head_hover(res, n_at, delta_nll),
                          title="Head regimes: which source wins each query's largest contribution", colorbar="regime",
                          categories=[regime_gloss(r) for r in REGIMES], colors=[REGIME_COLORS[r] for r in REGIMES])
        return fig
    if color == "delta_nll":
        if delta_nll is None:
            raise TLGeometryError("color='delta_nll' needs the delta_nll tensor (single_head_scan).")
        return grid_figure(delta_nll, _head_hover(res, n_at, delta_nll), title="ΔNLL of removing each head alone",
                           colorbar="ΔNLL", diverging=_signed(delta_nll))
    values = res.geometry.mean(color)
    diverging = color == "gap" or color.startswith(("align_", "sink_cosine"))
    if values.ndim == 2:
        return grid_figure(values, _head_hover(res, n_at, delta_nll), title=color, colorbar=color, diverging=diverging)
    if values.ndim != 3:
        raise TLGeometryError(f"{color!r} is not a per-head metric (shape {tuple(values.shape)}).")
    return _per_n_map(values, ns, n_at, [_head_hover(res, i, delta_nll) for i in range(len(ns))],
                      title=f"{color} per head", colorbar=color, diverging=diverging)


def _signed(values: torch.Tensor) -> bool:
    """Values of both signs: drawn on a diverging scale centred on 0."""
    finite = values[torch.isfinite(values)]
    return bool((finite < 0).any()) and bool((finite > 0).any())


def _model_series(per_sequence: torch.Tensor, heads_mask: torch.Tensor | None = None):
    """[seq, layer, head, n] → mean over the chosen heads within each sequence → [seq, n]."""
    if heads_mask is not None:
        per_sequence = per_sequence[:, heads_mask]  # [seq, chosen, n]
        return per_sequence.nanmean(1)
    return per_sequence.nanmean((1, 2))


def separability_curves(res: Analysis) -> go.Figure:
    """F_N, P_N and R_N against N: top-N vs random with 95% bootstrap bands (all heads), and the
    top-N curve of each regime."""
    geo, tax = res.geometry, res.taxonomy
    ns = list(geo.n)
    fig = make_subplots(rows=1, cols=3, subplot_titles=("F_N", "precision P_N", "recall R_N"), shared_yaxes=True)
    for col, metric in enumerate(("f", "precision", "recall"), start=1):
        for source, dash in (("top", "solid"), ("random", "dash")):
            series = _model_series(geo.per_sequence[f"{metric}_{source}"])
            mean = series.nanmean(0)
            band = geo._bootstrap(series)  # the run's replicates and seed, as summary.csv
            name = f"all heads, {'top-N' if source == 'top' else 'random'}"
            fig.add_trace(go.Scatter(x=ns + ns[::-1], y=band[:, 1].tolist() + band[:, 0].flip(0).tolist(),
                                     mode="lines", fill="toself", line={"width": 0}, fillcolor="rgba(100,100,100,0.15)",
                                     hoverinfo="skip", showlegend=False, legendgroup=name), row=1, col=col)
            fig.add_trace(go.Scatter(x=ns, y=mean.tolist(), name=name, legendgroup=name, showlegend=col == 1,
                                     line={"color": "black", "dash": dash}), row=1, col=col)
        for i, regime in enumerate(REGIMES):
            chosen = tax.label_ids == i
            if not bool(chosen.any()):
                continue
            series = _model_series(geo.per_sequence[f"{metric}_top"], chosen)
            fig.add_trace(go.Scatter(x=ns, y=series.nanmean(0).tolist(), name=f"top-N, {regime_gloss(regime)}", legendgroup=regime,
                                     showlegend=col == 1, line={"color": REGIME_COLORS[regime]}), row=1, col=col)
    fig.update_xaxes(type="log", title="N", tickvals=ns)
    fig.update_layout(title="Separability of top-N vs random sets", template="plotly_white", height=420)
    return fig


def sink_plots(res: Analysis) -> go.Figure:
    """Per layer: distribution over heads of the sink norm ratio and of the sink cosine; and the
    mean cos(v_0, v_j) by position j (a layer × lag heat map)."""
    geo = res.geometry
    if not geo.has_sink:
        raise TLGeometryError("this result has no sink diagnostics (run with sink=True).")
    fig = make_subplots(rows=1, cols=3, subplot_titles=("non-sink / sink value norm", "mean cos(v_0, v_j)",
                                                        "cos(v_0, v_j) by position j"))
    layers = geo.n_layers
    ratio, cosine = geo.mean("norm_ratio"), geo.mean("sink_cosine")
    for layer in range(layers):
        fig.add_trace(go.Box(y=ratio[layer].tolist(), name=str(layer), marker_color="#1f77b4", showlegend=False,
                             boxpoints=False), row=1, col=1)
        fig.add_trace(go.Box(y=cosine[layer].tolist(), name=str(layer), marker_color="#d62728", showlegend=False,
                             boxpoints=False), row=1, col=2)
    by_lag = geo.mean("cosine_by_lag").nanmean(1)  # [layer, pos]
    fig.add_trace(go.Heatmap(z=by_lag.tolist(), colorscale="RdBu", zmid=0, colorbar={"title": "cos", "x": 1.02},
                             hovertemplate="layer %{y}<br>position %{x}<br>cos %{z:.3f}<extra></extra>"), row=1, col=3)
    fig.update_yaxes(type="log", title="ratio", row=1, col=1)
    fig.update_xaxes(title="layer", row=1, col=1)
    fig.update_xaxes(title="layer", row=1, col=2)
    fig.update_xaxes(title="position j", row=1, col=3)
    fig.update_yaxes(title="layer", autorange="reversed", row=1, col=3)
    fig.update_layout(title="The attention sink (position 0)", template="plotly_white", height=420)
    return fig


def regime_fractions(taxonomy: HeadTaxonomy | Mapping[str, HeadTaxonomy]) -> go.Figure:
    """Share of each regime per layer (stacked bars); with several taxonomies (a mapping
    name → taxonomy, e.g. models or corpora) one bar per name for the whole model."""
    fig = go.Figure()
    if isinstance(taxonomy, HeadTaxonomy):
        frame = taxonomy.fractions().iloc[:-1]
        for regime in REGIMES:
            fig.add_trace(go.Bar(x=frame["layer"].tolist(), y=frame[regime].tolist(), name=regime_gloss(regime),
                                 marker_color=REGIME_COLORS[regime]))
        fig.update_xaxes(title="layer", dtick=1)
        title = "Regime share per layer"
    else:
        names = [safe_text(name) for name in taxonomy]
        overall = [t.fractions().iloc[-1] for t in taxonomy.values()]
        for regime in REGIMES:
            fig.add_trace(go.Bar(x=names, y=[float(o[regime]) for o in overall], name=regime_gloss(regime),
                                 marker_color=REGIME_COLORS[regime]))
        title = "Regime share per model"
    fig.update_layout(barmode="stack", yaxis={"title": "share of heads", "range": [0, 1]}, title=title,
                      template="plotly_white", height=380)
    return fig


def comparison_figures(comparison: Comparison) -> list[tuple[str, go.Figure]]:
    """The figures of a :class:`~tl_geometry.run.compare.Comparison`, titled: regime fractions and
    F_N gaps side by side, and with the same grid of heads the transition matrix, a map of the
    heads whose label changed, and maps of the per-head differences (``b − a``)."""
    c = comparison
    a_name, b_name = (safe_text(name) for name in c.names)
    figures = [("Regime shares", regime_fractions({c.names[0]: c.a.taxonomy, c.names[1]: c.b.taxonomy}))]
    curves = c.curves()
    gaps = go.Figure()
    for name in c.names:
        part = curves[curves["analysis"] == name]
        gaps.add_trace(go.Scatter(x=part["n"].tolist(), y=part["gap"].tolist(), mode="lines+markers",
                                  name=safe_text(name)))
    gaps.update_layout(title="F_N(top-N) − F_N(random), all heads", xaxis={"title": "N", "type": "log"},
                       yaxis={"title": "gap"}, template="plotly_white", height=380)
    figures.append(("Separability gap against N", gaps))
    if not c.head_by_head:
        return figures
    counts = c.transitions.tolist()
    matrix = go.Figure(go.Heatmap(z=counts, x=[f"{b_name}: {r}" for r in REGIMES], y=[f"{a_name}: {r}" for r in REGIMES],
                                  text=[[str(v) for v in row] for row in counts], texttemplate="%{text}",
                                  colorscale="Blues", showscale=False, hoverinfo="text"))
    matrix.update_layout(title="Regime transitions (heads)", yaxis={"autorange": "reversed"}, template="plotly_white",
                         height=360)
    figures.append(("Regime transitions", matrix))
    labels_a, labels_b = c.a.taxonomy.labels, c.b.taxonomy.labels
    layers, heads = c.a.taxonomy.shape
    hover = [[f"<b>{head_name(layer, head)}</b><br>{a_name}: {labels_a[layer, head]}<br>{b_name}: {labels_b[layer, head]}"
              for head in range(heads)] for layer in range(layers)]
    change = torch.where(c.a.taxonomy.label_ids == c.b.taxonomy.label_ids, 0, 1)
    figures.append(("Heads whose regime changed", grid_figure(
        change, hover, title=f"Regime changed from {a_name} to {b_name}", colorbar="changed",
        categories=["same regime", "changed"], colors=["#d9d9d9", "#ff7f0e"])))
    for key, delta in c.deltas.items():
        title = f"Δ {key} ({b_name} − {a_name})"
        if delta.ndim == 3:
            at = c.n.index(next((n for n in c.n if n > 1), c.n[0]))
            fig = _per_n_map(delta, c.n, at, [hover] * len(c.n), title=title, colorbar="Δ", diverging=True)
        else:
            fig = grid_figure(delta, hover, title=title, colorbar="Δ", diverging=True)
        figures.append((title, fig))
    return figures


