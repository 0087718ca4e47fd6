"""One head up close (:func:`head_drilldown`): a text's attention pattern and value geometry at one query, with its tokens made visible."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ..errors import TLGeometryError
from ..heads import head_name, parse_head
from .style import safe_text


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
    """One head on one text, at one query (default: the last token), in three panels: the sources'
    attention, their distances to the top-N aggregate, and their contributions in 2-D.

    The head as ``layer, head`` or in any of TransformerLens's conventions (``(3, 4)``, ``"L3H4"``, a
    flat index). The title gives P, R and F, the margin and the certified bounds in words;
    ``layout.meta`` the head, the query, N and the query's vote (``winner``: current, sink or other).

    - each source's attention, the top-N selected in red, the tokens on the axis;
    - the distances ``D_j = ‖y_j − s_N‖`` sorted, selected sources marked, with ``ρ_max`` and
      ``ρ_min`` as two lines: unselected points at or below ``ρ_max`` are what costs precision,
      selected points at or above ``ρ_min`` what costs recall;
    - the contributions ``y_i`` projected to 2-D (PCA) with ``s_N``; a source that dwarfs the
      others (usually the sink) is left off the axis range and marked at its edge.
    """
    from ..capture.adapters import stream_layers
    from ..capture.model_info import describe_model
    from ..run.inputs import tokenize_texts

    info = describe_model(model)
    layer, head = parse_head(head if len(head) != 1 else head[0], info.n_layers, info.n_heads)
    tokens, _ = tokenize_texts(model, [text])
    seen = {}
    stream_layers(model, tokens, lambda _layer, att: seen.setdefault("att", att), layers=[layer])
    att = seen["att"]
    t = tokens.shape[1] - 1 if query is None else int(query)
    if not 0 < t < tokens.shape[1] or n >= t + 1:
        raise TLGeometryError(f"query {t} with N={n} is out of range for {tokens.shape[1]} tokens (need N < t + 1).")
    labels = [f"{j}: {visible_token(model.tokenizer.decode([x]))}" for j, x in enumerate(tokens[0, :t + 1].tolist())]
    row = _Row.of(att, head, t, n, labels)
    fig = make_subplots(rows=1, cols=3, column_widths=[0.42, 0.30, 0.28], horizontal_spacing=0.07,
                        subplot_titles=(f"sources of query {labels[t]}", "distances to s_N, sorted",
                                        "contributions y_i (PCA)"))
    fig.add_trace(go.Bar(x=labels, y=row.alpha.tolist(), name="attention α", hovertext=row.hover, hoverinfo="text",
                         marker_color=[_COLORS[state] for state in row.status], showlegend=False), row=1, col=1)
    _distance_panel(fig, row)
    _pca_panel(fig, row, n)
    fig.update_xaxes(title="source", tickangle=-60, row=1, col=1)
    fig.update_yaxes(title="α", row=1, col=1)
    fig.update_xaxes(title="rank by distance", row=1, col=2)
    fig.update_yaxes(title="D_j", row=1, col=2)
    p, r, f, certified = _measured(att, head, t, n)
    margin = row.rho_min - row.rho_max
    reading = ("≥ 0: the selected sources are exactly the N nearest to s_N" if margin >= 0 else
               "< 0: an unselected source lies nearer s_N than a selected one")
    fig.update_layout(title=f"{head_name(layer, head)} at query {t}, N={n}: P={p:.2f} R={r:.2f} F={f:.2f}<br><sup>"
                            f"margin ρ_min − ρ_max = {margin:+.3f} ({reading}); {certified}</sup>",
                      template="plotly_white", height=500, margin={"t": 110},
                      legend={"x": 1.02, "xanchor": "left", "y": 1, "yanchor": "top"},  # clear of the panel titles
                      meta={"head": head_name(layer, head), "query": t, "n": n, "winner": row.winner})
    return fig


_COLORS = {"selected": "#d62728", "unselected": "#9e9e9e"}


@dataclass(frozen=True)
class _Row:
    """One query's sources ``0..t``: attention ``alpha``, contributions ``y = α v``, the top-N set
    (ties to the earlier source) with its aggregate ``s``, distances ``D_j = ‖y_j − s‖``, labels and
    hover texts."""

    labels: list[str]
    alpha: torch.Tensor
    y: torch.Tensor
    s: torch.Tensor
    dist: torch.Tensor
    selected: frozenset[int]

    @classmethod
    def of(cls, att: Any, head: int, t: int, n: int, labels: list[str]) -> _Row:
        alpha = att.pattern[0, head, t, :t + 1].double()
        y = alpha[:, None] * att.v[0, :t + 1, head].double()
        selected = frozenset(sorted(range(t + 1), key=lambda j: (-float(alpha[j]), j))[:n])
        s = y[list(selected)].sum(0)
        return cls(labels, alpha, y, s, (y - s).norm(dim=-1), selected)

    @property
    def winner(self) -> str:
        """The query's vote (docs/metrics.md#taxonomy): ``current``, ``sink`` or ``other`` source
        of its largest contribution ``α_j‖v_j‖`` (ties to the earlier source)."""
        w = int(self.y.norm(dim=-1).argmax())  # argmax returns the first of equal maxima
        t = len(self.labels) - 1
        return "current" if w == t else "sink" if w == 0 else "other"

    @property
    def status(self) -> list[str]:
        return ["selected" if j in self.selected else "unselected" for j in range(len(self.labels))]

    @property
    def rho_max(self) -> float:
        return max(float(self.dist[i]) for i in self.selected)

    @property
    def rho_min(self) -> float:
        return min(float(d) for j, d in enumerate(self.dist) if j not in self.selected)

    @property
    def hover(self) -> list[str]:
        return [f"{label}<br>α={a:.3f}<br>‖y‖={c:.3f}<br>D={d:.3f}<br>{state}" for label, a, c, d, state in
                zip(self.labels, self.alpha.tolist(), self.y.norm(dim=-1).tolist(), self.dist.tolist(), self.status,
                    strict=True)]


def _measured(att: Any, head: int, t: int, n: int) -> tuple[float, float, float, str]:
    """P, R, F as the package measures them, and what the certificate proves."""
    from ..measure.certificates import sink_aware_bounds
    from ..measure.metrics import separability

    prefix = (att.pattern[:, :, : t + 1, : t + 1], att.kv_values[:, : t + 1], n)
    sep = separability(*prefix, queries=torch.tensor([t]))
    p, r, f = (float(getattr(sep, k)[0, head, 0, 0]) for k in ("precision", "recall", "f"))
    bounds = sink_aware_bounds(*prefix, queries=torch.tensor([t]))
    p_low, r_low = float(bounds.precision[0, head, 0, 0]), float(bounds.recall[0, head, 0, 0])
    if p_low > n / (t + 1) or r_low > 0:
        certified = f"certified lower bounds P ≥ {p_low:.2f}, R ≥ {r_low:.2f}"
    else:
        certified = "no certified bound above the trivial P ≥ N/(t+1), R ≥ 0 here"
    return p, r, f, certified


def _distance_panel(fig: go.Figure, row: _Row) -> None:
    """The distances sorted, selected sources marked, with ``ρ_max`` and ``ρ_min`` as lines."""
    ranked = sorted(range(len(row.labels)), key=lambda j: (float(row.dist[j]), j))
    status, hover = row.status, row.hover
    for group, symbol in (("selected", "circle"), ("unselected", "circle-open")):
        ranks = [rank for rank, j in enumerate(ranked) if status[j] == group]
        fig.add_trace(go.Scatter(x=ranks, y=[float(row.dist[ranked[k]]) for k in ranks], mode="markers", name=group,
                                 marker={"color": _COLORS[group], "size": 9, "symbol": symbol},
                                 hovertext=[hover[ranked[k]] for k in ranks], hoverinfo="text"), row=1, col=2)
    for radius, name, dash, position in ((row.rho_max, "ρ_max", "solid", "top left"),
                                         (row.rho_min, "ρ_min", "dash", "bottom right")):
        fig.add_hline(y=radius, line={"dash": dash, "color": "black", "width": 1}, annotation_text=name,
                      annotation_position=position, row=1, col=2)


def _pca_panel(fig: go.Figure, row: _Row, n: int) -> None:
    """The contributions and ``s_N`` projected to 2-D (PCA); a source that dwarfs the others is
    left off the axis range and marked at its edge."""
    points = torch.cat([row.y, row.s[None]])
    centred = points - points.mean(0)
    basis = (torch.linalg.svd(centred, full_matrices=False).Vh[:2] if centred.shape[0] > 1
             else torch.eye(2, row.y.shape[1], dtype=centred.dtype))
    xy = centred @ basis.T
    status, hover = row.status, row.hover
    for group in ("selected", "unselected"):
        members = [j for j in range(len(row.labels)) if status[j] == group]
        fig.add_trace(go.Scatter(x=xy[members, 0].tolist(), y=xy[members, 1].tolist(), mode="markers", name=group,
                                 marker={"color": _COLORS[group], "size": 8}, hovertext=[hover[j] for j in members],
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
        fig.add_annotation(x=float(edge[0]), y=float(edge[1]), text=f"{row.labels[big]} (off scale)", showarrow=False,
                           bgcolor="rgba(255,255,255,0.8)", row=1, col=3)
