"""What every figure shares (present/style.py): regime colours that stay apart under deuteranopia, and escaped text."""

from __future__ import annotations

from tl_geometry import plots
from tl_geometry.label.taxonomy import REGIMES

from .colour_vision import deuteranope


def test_regime_colours_stay_apart_for_adeuteranope():
    seen = [deuteranope(plots.REGIME_COLORS[r]) for r in REGIMES]
    gaps = [float((seen[i] - seen[j]).norm()) for i in range(3) for j in range(i + 1, 3)]
    assert min(gaps) > 0.25, gaps
    # the old red and green fall together: the check can fail
    assert float((deuteranope("#d62728") - deuteranope("#2ca02c")).norm()) < 0.25


def test_text_is_escaped_for_html_labels_and_attributes():
    assert plots.safe_text('<b a="x">\'&') == "&lt;b a=&quot;x&quot;&gt;&#x27;&amp;"
    assert plots.safe_text(3.5) == "3.5"
