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

import html
from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ..errors import TLGeometryError
from ..io import head_name, parse_head
from ..label.head_types import HEAD_TYPES
from ..label.taxonomy import REGIMES, HeadTaxonomy
from ..run.analysis import Analysis
from ..run.compare import Comparison

__all__ = ["REGIME_COLORS", "safe_text", "visible_token", "head_map", "grid_figure", "separability_curves", "sink_plots", "regime_fractions",
           "pruning_plot", "streaming_plot", "head_drilldown", "topn_plot", "comparison_figures"]

# Okabe–Ito colours: distinguishable with every common colour-vision deficiency (the test checks
# them under a simulated deuteranopia).
REGIME_COLORS = {"retriever": "#0072B2", "mixer": "#E69F00", "reset": "#CC79A7"}


def safe_text(text: Any) -> str:
    """HTML-escaped string (quotes included): safe inside plotly text and any HTML attribute."""
    return html.escape(str(text), quote=True)


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
    rows = []
    for layer in range(layers):
        row = []
        for head in range(heads):
            shares = tax.shares[layer, head].tolist()
            text = (f"<b>L{layer}H{head}</b><br>regime: {tax.labels[layer, head]} "
                    f"(current {shares[0]:.2f}, sink {shares[1]:.2f}, other {shares[2]:.2f})<br>"
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
    names = [[head_name(layer, head) for head in range(heads)] for layer in range(layers)]
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
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 1, "xanchor": "right"})
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
    """Layers × heads heatmap coloured by regime (categorical, with a legend) or by a per-head
    metric (continuous scale; signed values diverge around 0).

    ``color``: ``"regime"``, any geometry metric (``"gap"``, ``"f_top"``, ``"norm_ratio"``, …),
    ``"delta_nll"`` with ``delta_nll`` given, a head type (``"previous_token"``,
    ``"duplicate_token"``, ``"induction"``) with head types attached, or your own ``[n_layers, n_heads]`` tensor (e.g. a
    TransformerLens head-detector score) shown under ``title``. A metric with an N axis gets one
    button per N, the figure opening at ``n``. Every cell carries its head name ``L{l}H{h}`` as
    ``customdata`` so a ``plotly_click`` handler can open its drill-down (the HTML report does).
    """
    n_at, n_value = _n_index(res, n)
    ns = res.geometry.n
    if delta_nll is not None:
        delta_nll = _per_head(res, delta_nll, "delta_nll (single_head_scan's result)")
    if isinstance(color, torch.Tensor):
        values = _per_head(res, color, "a tensor to colour the heads by")
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
        fig = grid_figure(res.taxonomy.label_ids, _head_hover(res, n_at, delta_nll), title="Head regimes",
                          colorbar="regime", categories=list(REGIMES), colors=[REGIME_COLORS[r] for r in REGIMES])
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


def _per_head(res: Analysis, values: Any, what: str) -> torch.Tensor:
    """``values`` as a float64 ``[n_layers, n_heads]`` tensor of this analysis' heads, or one line."""
    shape = list(res.taxonomy.shape)
    if (not isinstance(values, torch.Tensor) or list(values.shape) != shape or values.dtype == torch.bool
            or values.is_complex()):
        got = f"{values.dtype} {list(values.shape)}" if isinstance(values, torch.Tensor) else type(values).__name__
        raise TLGeometryError(f"{what} must be a real [n_layers, n_heads] = {shape} tensor; got {got}.")
    return values.detach().cpu().double()


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
            fig.add_trace(go.Scatter(x=ns, y=series.nanmean(0).tolist(), name=f"{regime}, top-N", legendgroup=regime,
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
            fig.add_trace(go.Bar(x=frame["layer"].tolist(), y=frame[regime].tolist(), name=regime,
                                 marker_color=REGIME_COLORS[regime]))
        fig.update_xaxes(title="layer", dtick=1)
        title = "Regime share per layer"
    else:
        names = [safe_text(name) for name in taxonomy]
        overall = [t.fractions().iloc[-1] for t in taxonomy.values()]
        for regime in REGIMES:
            fig.add_trace(go.Bar(x=names, y=[float(o[regime]) for o in overall], name=regime,
                                 marker_color=REGIME_COLORS[regime]))
        title = "Regime share per model"
    fig.update_layout(barmode="stack", yaxis={"title": "share of heads", "range": [0, 1]}, title=title,
                      template="plotly_white", height=380)
    return fig


def comparison_figures(comparison: Comparison) -> list[tuple[str, go.Figure]]:
    """The figures of a :class:`~tl_geometry.compare.Comparison`, titled: regime fractions and
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


def pruning_plot(curves) -> go.Figure:
    """Relative ΔNLL against retention (share of heads kept), one line per importance method."""
    fig = go.Figure()
    for method, frame in curves.groupby("method", sort=False):
        frame = frame.sort_values("retention")
        color = REGIME_COLORS["mixer"] if method == "taxonomy" else None
        fig.add_trace(go.Scatter(x=frame["retention"].tolist(), y=frame["delta_nll"].tolist(), name=safe_text(method),
                                 mode="lines+markers", line={"color": color, "width": 3 if method == "taxonomy" else 1.5}))
    fig.update_layout(title="Pruning: loss increase against heads kept", xaxis={"title": "retention", "autorange": "reversed"},
                      yaxis={"title": "ΔNLL (relative)"}, template="plotly_white", height=380)
    return fig


def streaming_plot(curve) -> go.Figure:
    """Relative ΔNLL against the share of kv heads that stream (:class:`~tl_geometry.StreamingCurve`),
    one line per order; the random orders' mean with their range as a band."""
    fig = go.Figure()
    x = list(curve.fractions)
    if "random" in curve.delta_nll:
        runs = curve.delta_nll["random"]
        fig.add_trace(go.Scatter(x=x + x[::-1], y=runs.amax(0).tolist() + runs.amin(0).tolist()[::-1], fill="toself",
                                 line={"width": 0}, fillcolor="rgba(128,128,128,0.2)", hoverinfo="skip",
                                 name=f"random (range of {runs.shape[0]} seeds)"))
    for name in curve.delta_nll:
        style = {"color": REGIME_COLORS["mixer"], "width": 3} if name == "taxonomy" else {"width": 1.5}
        if name == "oracle":
            style = {"color": "black", "dash": "dot", "width": 2}
        fig.add_trace(go.Scatter(x=x, y=curve.mean_curve(name).tolist(), mode="lines+markers", line=style,
                                 name=safe_text("random (mean)" if name == "random" else name)))
    settings = curve.settings
    fig.update_layout(title=safe_text(f"Streaming kv heads (sink {settings.get('sink')} + window {settings.get('window')} "
                                      f"of {settings.get('seq_len')} tokens): loss against the share streamed"),
                      xaxis={"title": "share of kv heads streaming", "range": [0, 1]},
                      yaxis={"title": "ΔNLL (relative)"}, template="plotly_white", height=400)
    return fig


def topn_plot(deletion) -> go.Figure:
    """ΔNLL of top-N attention deletion against N (one or more :class:`TopNDeletion`)."""
    items = deletion if isinstance(deletion, list | tuple) else [deletion]
    fig = go.Figure()
    for item in items:
        fig.add_trace(go.Scatter(x=list(item.n), y=item.delta_nll.tolist(), mode="lines+markers",
                                 name="renormalised" if item.renormalise else "weights kept"))
    for tau in (0.01, 0.05, 0.10):
        fig.add_hline(y=tau, line={"dash": "dot", "color": "grey"}, annotation_text=f"{tau:.0%}")
    fig.update_layout(title="Top-N attention deletion", xaxis={"title": "N kept per query", "type": "log"},
                      yaxis={"title": "ΔNLL (relative)", "type": "log"}, template="plotly_white", height=380)
    return fig


def visible_token(text: str) -> str:
    """A token for display: whitespace made visible (␣ space, ↵ newline, ⇥ tab, ∅ empty), then escaped."""
    shown = text.replace(" ", "␣").replace("\n", "↵").replace("\r", "␍").replace("\t", "⇥")
    return safe_text(shown or "∅")


def _off_scale(xy: torch.Tensor) -> int | None:
    """The index of a point so far from the others (more than 4 times their spread) that an axis
    range holding it would squash the rest to a dot, or None."""
    if xy.shape[0] < 3:
        return None
    big = int(xy.norm(dim=-1).argmax())
    others = torch.cat([xy[:big], xy[big + 1:]])
    spread = float((others - others.mean(0)).norm(dim=-1).max())
    return big if float((xy[big] - others.mean(0)).norm()) > 4 * max(spread, 1e-12) else None


def head_drilldown(model: Any, text: str, *head: Any, n: int = 4, query: int | None = None) -> go.Figure:
    """One head on one text, at one query (default: the last token). The head as ``layer, head``
    or in any of TransformerLens's conventions (``(3, 4)``, ``"L3H4"``, a flat index). Three panels:

    - each source's attention, the top-N selected in red, the tokens on the axis;
    - the distances ``D_j = ‖y_j − s_N‖`` sorted, selected sources marked, with ``ρ_max`` and
      ``ρ_min`` as two lines: unselected points at or below ``ρ_max`` are what costs precision,
      selected points at or above ``ρ_min`` what costs recall;
    - the contributions ``y_i`` projected to 2-D (PCA) with ``s_N``; a source that dwarfs the
      others (usually the sink) is left off the axis range and marked at its edge.
    """
    from ..capture.adapters import describe_model, stream_layers
    from ..measure.metrics import separability
    from ..measure.regime import sink_aware_bounds
    from ..run.analysis import tokenize_texts

    info = describe_model(model)
    layer, head = parse_head(head if len(head) != 1 else head[0], info.n_layers, info.n_heads)
    tokens, _ = tokenize_texts(model, [text])
    seen = {}
    stream_layers(model, tokens, lambda _layer, att: seen.setdefault("att", att), layers=[layer])
    att = seen["att"]
    t = tokens.shape[1] - 1 if query is None else int(query)
    if not 0 < t < tokens.shape[1] or n >= t + 1:
        raise TLGeometryError(f"query {t} with N={n} is out of range for {tokens.shape[1]} tokens (need N < t + 1).")
    alpha = att.pattern[0, head, t, :t + 1].double()
    v = att.v[0, :t + 1, head].double()
    y = alpha[:, None] * v
    order = sorted(range(t + 1), key=lambda j: (-float(alpha[j]), j))
    selected = set(order[:n])
    s = y[list(selected)].sum(0)
    dist = (y - s).norm(dim=-1)
    rho_max = max(float(dist[i]) for i in selected)
    rho_min = min(float(dist[j]) for j in range(t + 1) if j not in selected)
    prefix = (att.pattern[:, :, : t + 1, : t + 1], att.kv_values[:, : t + 1], n)
    sep = separability(*prefix, queries=torch.tensor([t]))
    p, r, f = (float(getattr(sep, k)[0, head, 0, 0]) for k in ("precision", "recall", "f"))
    bounds = sink_aware_bounds(*prefix, queries=torch.tensor([t]))
    p_low, r_low = float(bounds.precision[0, head, 0, 0]), float(bounds.recall[0, head, 0, 0])
    if p_low > n / (t + 1) or r_low > 0:
        certified = (f"certified: the top-{n} set is separable with precision ≥ {p_low:.2f}, "
                     f"recall ≥ {r_low:.2f} (Theorems 1–2)")
    else:
        certified = "the certificate proves nothing beyond the trivial bounds here"
    labels = [f"{j}: {visible_token(model.tokenizer.decode([x]))}" for j, x in enumerate(tokens[0, :t + 1].tolist())]
    status = ["selected" if j in selected else "unselected" for j in range(t + 1)]
    hover = [f"{label}<br>α={a:.3f}<br>‖y‖={c:.3f}<br>D={d:.3f}<br>{state}" for label, a, c, d, state in
             zip(labels, alpha.tolist(), y.norm(dim=-1).tolist(), dist.tolist(), status, strict=True)]

    fig = make_subplots(rows=1, cols=3, column_widths=[0.42, 0.30, 0.28], horizontal_spacing=0.07,
                        subplot_titles=(f"sources of query {labels[t]}", "distances to s_N, sorted",
                                        "contributions y_i (PCA)"))
    colors = ["#d62728" if j in selected else "#9e9e9e" for j in range(t + 1)]
    fig.add_trace(go.Bar(x=labels, y=alpha.tolist(), name="attention α", marker_color=colors, hovertext=hover,
                         hoverinfo="text", showlegend=False), row=1, col=1)
    ranked = sorted(range(t + 1), key=lambda j: (float(dist[j]), j))
    for group, color, symbol in (("selected", "#d62728", "circle"), ("unselected", "#9e9e9e", "circle-open")):
        ranks = [rank for rank, j in enumerate(ranked) if status[j] == group]
        fig.add_trace(go.Scatter(x=ranks, y=[float(dist[ranked[k]]) for k in ranks], mode="markers", name=group,
                                 marker={"color": color, "size": 9, "symbol": symbol},
                                 hovertext=[hover[ranked[k]] for k in ranks], hoverinfo="text"), row=1, col=2)
    for radius, name, dash, position in ((rho_max, "ρ_max", "solid", "top left"),
                                         (rho_min, "ρ_min", "dash", "bottom right")):
        fig.add_hline(y=radius, line={"dash": dash, "color": "black", "width": 1}, annotation_text=name,
                      annotation_position=position, row=1, col=2)
    points = torch.cat([y, s[None]])
    centred = points - points.mean(0)
    basis = torch.linalg.svd(centred, full_matrices=False).Vh[:2] if centred.shape[0] > 1 else torch.eye(2, v.shape[1])
    xy = centred @ basis.T
    for group, color in (("selected", "#d62728"), ("unselected", "#9e9e9e")):
        members = [j for j in range(t + 1) if status[j] == group]
        fig.add_trace(go.Scatter(x=xy[members, 0].tolist(), y=xy[members, 1].tolist(), mode="markers", name=group,
                                 marker={"color": color, "size": 8}, hovertext=[hover[j] for j in members],
                                 hoverinfo="text", showlegend=False), row=1, col=3)
    fig.add_trace(go.Scatter(x=[float(xy[-1, 0])], y=[float(xy[-1, 1])], mode="markers", name=f"s_N (N={n})",
                             marker={"symbol": "star", "size": 15, "color": "black"}), row=1, col=3)
    big = _off_scale(xy[:-1])
    if big is not None:
        rest = torch.cat([xy[:big], xy[big + 1:]])  # s_N stays in range
        pad = 0.1 * float((rest.max(0).values - rest.min(0).values).max()) or 1.0
        lo, hi = rest.min(0).values - pad, rest.max(0).values + pad
        fig.update_xaxes(range=[float(lo[0]), float(hi[0])], row=1, col=3)
        fig.update_yaxes(range=[float(lo[1]), float(hi[1])], row=1, col=3)
        edge = torch.maximum(torch.minimum(xy[big], hi), lo)
        fig.add_annotation(x=float(edge[0]), y=float(edge[1]), text=f"{labels[big]} (off scale)", showarrow=False,
                           bgcolor="rgba(255,255,255,0.8)", row=1, col=3)
    fig.update_xaxes(title="source", tickangle=-60, row=1, col=1)
    fig.update_yaxes(title="α", row=1, col=1)
    fig.update_xaxes(title="rank by distance", row=1, col=2)
    fig.update_yaxes(title="D_j", row=1, col=2)
    fig.update_layout(title=f"{head_name(layer, head)}, N={n}: P={p:.2f} R={r:.2f} F={f:.2f}, "
                            f"margin {rho_min - rho_max:+.3f}; {certified}", template="plotly_white", height=480,
                      legend={"orientation": "h", "y": 1.1, "x": 1, "xanchor": "right"})
    return fig

