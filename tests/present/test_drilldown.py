"""One head up close (present/drilldown.py): tokens made visible and escaped, a dominant point kept off the PCA range, a real model's drill-down."""

from __future__ import annotations

import re

import pytest
import torch

from tl_geometry import plots
from tl_geometry.present import drilldown


def test_whitespace_tokens_are_visible_and_escaped():
    assert plots.visible_token(" the") == "␣the" and plots.visible_token("\n\t") == "↵⇥"
    assert plots.visible_token("") == "∅" and plots.visible_token(" <b>") == "␣&lt;b&gt;"


def test_a_dominant_point_is_left_off_the_pca_range():
    cloud = torch.randn(10, 2, generator=torch.Generator().manual_seed(0))
    assert drilldown._off_scale(cloud) is None
    cloud[0] = torch.tensor([80.0, -60.0])  # a sink that dwarfs the rest
    assert drilldown._off_scale(cloud) == 0


@pytest.mark.slow
def test_drilldown_on_a_real_model_escapes_tokens(smollm2):
    fig = plots.head_drilldown(smollm2, "Attention sinks <script>alert(1)</script> are \"quoted\" here.", 3, 1, n=2)
    text = fig.to_json()
    assert "<script" not in text and "&lt;" in text  # token pieces of the tag arrive escaped
    t = len(fig.data[0].x) - 1
    assert fig.layout.title.text.startswith(f"L3H1 at query {t}, N=2: P=")
    norms = [float(re.search(r"‖y‖=([\d.]+)", hover)[1]) for hover in fig.data[0].hovertext]
    w = norms.index(max(norms))  # the query's vote: the source of its largest contribution
    assert fig.layout.meta == {"head": "L3H1", "query": t, "n": 2,
                               "winner": "current" if w == t else "sink" if w == 0 else "other"}
    bars, selected, unselected = fig.data[0], fig.data[1], fig.data[2]
    assert bars.x[2].startswith("2: ␣") and all(": " in label for label in bars.x)  # tokens, spaces visible
    distances = sorted([*zip(selected.x, selected.y, strict=True), *zip(unselected.x, unselected.y, strict=True)])
    assert [d for _, d in distances] == sorted(d for _, d in distances)  # sorted by distance
    rho_max, rho_min = max(selected.y), min(unselected.y)
    assert sorted(shape.y0 for shape in fig.layout.shapes) == sorted([rho_max, rho_min])  # the two radii as lines
    # P and R read off the picture: outsiders at or under ρ_max, insiders under ρ_min
    p, r = (float(x) for x in re.findall(r"P=([\d.]+) R=([\d.]+)", fig.layout.title.text)[0])
    inside = sum(d <= rho_max for d in unselected.y)
    assert p == pytest.approx(2 / (2 + inside), abs=0.005) and r == pytest.approx(sum(d < rho_min for d in selected.y) / 2, abs=0.005)
    positions = {a.text: (a.xanchor, a.yanchor) for a in fig.layout.annotations if a.text in ("ρ_max", "ρ_min")}
    assert len(positions) == 2 and positions["ρ_max"] != positions["ρ_min"]  # the labels do not sit on each other
    # the certificate's line, never above what the picture shows
    found = re.search(r"certified lower bounds P ≥ ([\d.]+), R ≥ ([\d.]+)", fig.layout.title.text)
    assert found or "no certified bound above the trivial" in fig.layout.title.text
    margin = float(re.search(r"ρ_max = ([+−-][\d.]+)", fig.layout.title.text)[1].replace("−", "-"))
    assert margin == pytest.approx(rho_min - rho_max, abs=0.0005)
    assert ("≥ 0: the selected sources are exactly" in fig.layout.title.text) == (margin >= 0)
    assert fig.layout.legend.x > 1  # beside the panels, clear of their titles
    if found:
        assert float(found[1]) <= p + 0.005 and float(found[2]) <= r + 0.005
    same = plots.head_drilldown(smollm2, "Attention sinks <script>alert(1)</script> are \"quoted\" here.", "L3H1", n=2)
    assert same.layout.title.text == fig.layout.title.text  # the head by its name
