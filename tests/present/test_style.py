"""What every figure shares (present/style.py): regime colours that stay apart under deuteranopia, and escaped text."""

from __future__ import annotations

import html
import re
import shutil
import subprocess

import plotly.graph_objects as go
import plotly.io
import pytest

from tl_geometry import plots
from tl_geometry.label.taxonomy import REGIMES

from .colour_vision import deuteranope


def test_regime_colours_stay_apart_for_adeuteranope():
    seen = [deuteranope(plots.REGIME_COLORS[r]) for r in REGIMES]
    gaps = [float((seen[i] - seen[j]).norm()) for i in range(3) for j in range(i + 1, 3)]
    assert min(gaps) > 0.25, gaps
    # the old red and green fall together: the check can fail
    assert float((deuteranope("#d62728") - deuteranope("#2ca02c")).norm()) < 0.25


def test_text_is_escaped_for_plotlys_labels_and_quotes_kept():
    assert plots.safe_text('<b a="x">\'&') == "&lt;b a=\"x\"&gt;'&amp;"
    assert plots.safe_text(3.5) == "3.5"


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="headless Chromium is not installed (Debian package `chromium`; .ci/run installs it)")
def test_tokens_show_as_themselves_in_a_rendered_figure(tmp_path):
    """A token with quotes, ``&`` and a tag, through safe_text into tick labels and a legend: the
    browser shows the characters (no entity spelled out, no tag opened)."""
    token = 'say "hi" & <b>it\'s</b>'
    fig = go.Figure(go.Bar(x=[plots.safe_text(token), "ok"], y=[1, 2], name=plots.safe_text(token), showlegend=True))
    path = tmp_path / "fig.html"
    path.write_text(plotly.io.to_html(fig, include_plotlyjs=True, full_html=True), encoding="utf-8")
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                          "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120).stdout
    texts = [html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", dom)]
    assert texts.count(token) >= 2  # the tick label and the legend entry, character for character
    assert not any("&quot;" in t or "&#" in t for t in texts)
