"""Figures of the derived jobs: pruning curves, streaming curves and top-N deletion."""

from __future__ import annotations

import plotly.graph_objects as go

from .style import REGIME_COLORS, safe_text


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
