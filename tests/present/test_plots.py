"""Plotly figures: heatmap head maps hold the analysis' values, cells fill the plot in a browser."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import plotly.io
import pytest
import torch

import tl_geometry as tlg
from tl_geometry import plots
from tl_geometry.errors import TLGeometryError
from tl_geometry.label.taxonomy import REGIMES, regime_gloss

from ..tiny import random_tokens, tiny_model
from .colour_vision import deuteranope


@pytest.fixture(scope="module")
def res():
    return tlg.analyze(tiny_model(4, 2), random_tokens(3, 12, seed=3), (1, 2, 4), repeats=1, progress=False,
                       bootstrap=10)


def as_tensor(grid) -> torch.Tensor:
    return torch.tensor([[float("nan") if v is None else v for v in row] for row in grid], dtype=torch.float64)


def test_regime_map_is_a_categorical_heatmap_with_a_legend(res):
    fig = plots.head_map(res, "regime")
    heat = fig.data[0]
    assert heat.type == "heatmap" and torch.equal(as_tensor(heat.z), res.taxonomy.label_ids.double())
    assert heat.customdata[2][3] == "L2H3" and f"L2H3</b>: {regime_gloss(res.taxonomy.labels[2, 3])}<br>" in heat.text[2][3]
    legend = [(t.name, t.marker.color) for t in fig.data[1:]]
    assert legend == [(regime_gloss(r), plots.REGIME_COLORS[r]) for r in REGIMES]  # each label with its meaning
    assert fig.layout.legend.x > 1  # beside the grid, clear of the title above it
    # the step colour scale maps label i to colour i
    scale = heat.colorscale
    for i, regime in enumerate(REGIMES):
        position = (i + 0.5) / 3
        assert next(c for edge, c in scale if edge >= position) == plots.REGIME_COLORS[regime]


def test_per_n_metric_has_one_button_per_n(res):
    fig = plots.head_map(res, "gap", n=4)
    gap = res.geometry.mean("f_top") - res.geometry.mean("f_random")
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == ["N=1", "N=2", "N=4"] and fig.layout.updatemenus[0].active == 2
    for i, button in enumerate(buttons):
        torch.testing.assert_close(as_tensor(button.args[0]["z"][0]), gap[..., i].double(), equal_nan=True)
    torch.testing.assert_close(as_tensor(fig.data[0].z), gap[..., 2].double(), equal_nan=True)
    assert fig.data[0].zmid == 0 and fig.data[0].zmin == -fig.data[0].zmax  # diverging around 0
    per_head = plots.head_map(res, "norm_ratio")
    assert not per_head.layout.updatemenus and per_head.data[0].colorscale[0][1] == "#440154"  # Viridis
    with pytest.raises(TLGeometryError, match="delta_nll tensor"):
        plots.head_map(res, "delta_nll")


def test_any_per_head_tensor_is_mapped_with_its_title_and_signed_values_diverge(res):
    layers, heads = res.taxonomy.shape
    scores = torch.linspace(-1, 2, layers * heads).reshape(layers, heads)
    fig = plots.head_map(res, scores, title="previous-token score")
    assert fig.layout.title.text == "previous-token score" and fig.data[0].zmid == 0
    torch.testing.assert_close(as_tensor(fig.data[0].z), scores.double())
    positive = plots.head_map(res, scores.abs(), title="|score|")
    assert positive.data[0].zmid is None
    with pytest.raises(TLGeometryError, match=r"one number per head, \[n_layers, n_heads\]"):
        plots.head_map(res, torch.zeros(layers + 1, heads))


@pytest.mark.parametrize("delta_nll", [torch.zeros(2, 2), torch.zeros(3, 4, 1), torch.zeros(3, 4, dtype=torch.bool)],
                         ids=["too small", "an extra axis", "booleans"])
def test_a_scan_of_the_wrong_shape_is_one_line(res, delta_nll):
    for color in ("delta_nll", "regime"):  # the hover text reads it whatever the colour
        with pytest.raises(TLGeometryError, match=r"delta_nll \(single_head_scan's result\) must be one number per "
                                                  r"head, \[n_layers, n_heads\] = \[3, 4\]"):
            plots.head_map(res, color, delta_nll=delta_nll)


def test_bands_carry_no_markers(res):
    fig = plots.separability_curves(res)
    bands = [trace for trace in fig.data if trace.fill == "toself"]
    assert bands and all(trace.mode == "lines" for trace in bands)


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="headless Chromium is not installed (Debian package `chromium`; .ci/run installs it)")
@pytest.mark.parametrize(("layers", "heads"), [(30, 9), (18, 4), (32, 32)])
def test_cells_cover_most_of_the_plot_area_in_a_browser(tmp_path, layers, heads):
    labels = torch.randint(0, 3, (layers, heads), generator=torch.Generator().manual_seed(layers))
    hover = [[f"L{a}H{b}" for b in range(heads)] for a in range(layers)]
    fig = plots.grid_figure(labels, hover, title="map", colorbar="regime", categories=list(REGIMES),
                            colors=list(plots.REGIME_COLORS.values()))
    measure = """<script>setTimeout(function () {
      var area = document.querySelector('.nsewdrag').getBoundingClientRect();
      var cells = document.querySelector('.hm image').getBoundingClientRect();
      document.body.insertAdjacentHTML('beforeend', '<pre id="ratio">' +
        (cells.width * cells.height / (area.width * area.height)).toFixed(3) + ' ' + area.width.toFixed(0) +
        ' ' + area.height.toFixed(0) + '</pre>');
    }, 500);</script></body>"""
    page = plotly.io.to_html(fig, include_plotlyjs=True, full_html=True).replace("</body>", measure)
    path = tmp_path / "map.html"
    path.write_text(page, encoding="utf-8")
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                          "--window-size=1200,900", "--dump-dom", path.as_uri()], capture_output=True, text=True,
                         timeout=120)
    found = re.search(r'<pre id="ratio">([\d.]+) (\d+) (\d+)</pre>', dom.stdout)
    assert found, dom.stderr[-1000:]
    ratio, width, height = float(found[1]), int(found[2]), int(found[3])
    assert ratio > 0.9 and width > 300 and height > 200  # cells fill the grid; the grid fills the plot


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="headless Chromium is not installed (Debian package `chromium`; .ci/run installs it)")
def test_the_rendered_head_map_stays_readable_for_adeuteranope(tmp_path):
    """A screenshot of the regime map in a browser: each regime's cells are there in its colour, and
    after a deuteranopia simulation of the screenshot's pixels the three stay apart."""
    from PIL import Image

    labels = torch.arange(3).repeat(10, 3)  # every regime, in stripes
    hover = [[f"L{a}H{b}" for b in range(9)] for a in range(10)]
    fig = plots.grid_figure(labels, hover, title="map", colorbar="regime", categories=list(REGIMES),
                            colors=[plots.REGIME_COLORS[r] for r in REGIMES])
    path = tmp_path / "map.html"
    path.write_text(plotly.io.to_html(fig, include_plotlyjs=True, full_html=True), encoding="utf-8")
    shot = tmp_path / "map.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                    "--hide-scrollbars", "--window-size=900,700", f"--screenshot={shot}", path.as_uri()],
                   capture_output=True, timeout=120)
    pixels = torch.from_numpy(np.array(Image.open(shot).convert("RGB"))).reshape(-1, 3).double()
    seen = {}
    for regime in REGIMES:
        colour = plots.REGIME_COLORS[regime]
        target = torch.tensor([int(colour[i:i + 2], 16) for i in (1, 3, 5)], dtype=torch.float64)
        mine = pixels[(pixels - target).abs().max(-1).values <= 2]
        assert len(mine) > 0.05 * len(pixels), (regime, len(mine))  # its stripes fill a share of the page
        seen[regime] = deuteranope("#" + "".join(f"{int(round(x)):02x}" for x in mine.mean(0).tolist()))
    gaps = [float((seen[a] - seen[b]).norm()) for i, a in enumerate(REGIMES) for b in REGIMES[i + 1:]]
    assert min(gaps) > 0.25, gaps


def test_an_unknown_colour_is_one_clear_error(res):
    with pytest.raises(TLGeometryError, match="unknown metric 'bogus'"):
        plots.head_map(res, color="bogus")
