"""Figures of the derived jobs (present/job_plots.py): each line holds the job's own numbers, in
order, under an escaped name; the taxonomy's line and the oracle stand out."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from tl_geometry.intervene.pruning import TopNDeletion
from tl_geometry.intervene.streaming import StreamingCurve
from tl_geometry.present.job_plots import pruning_plot, streaming_plot, topn_plot
from tl_geometry.present.style import REGIME_COLORS


def test_pruning_lines_are_sorted_by_retention_one_per_method():
    curves = pd.DataFrame({"method": ["taxonomy", "<b>random</b>", "taxonomy", "<b>random</b>", "taxonomy"],
                           "retention": [0.5, 0.9, 1.0, 0.5, 0.9], "delta_nll": [0.3, 0.05, 0.0, 0.4, 0.1]})
    fig = pruning_plot(curves)
    assert [trace.name for trace in fig.data] == ["taxonomy", "&lt;b&gt;random&lt;/b&gt;"]
    taxonomy, random = fig.data
    assert list(taxonomy.x) == [0.5, 0.9, 1.0] and list(taxonomy.y) == [0.3, 0.1, 0.0]
    assert list(random.x) == [0.5, 0.9] and list(random.y) == [0.4, 0.05]
    assert taxonomy.line.color == REGIME_COLORS["mixer"] and taxonomy.line.width > random.line.width
    assert fig.layout.xaxis.autorange == "reversed"  # from all heads kept to few


def test_streaming_lines_are_the_mean_curves_with_the_random_range_as_a_band():
    random = torch.tensor([[0.1, 0.3], [0.2, 0.5], [0.0, 0.4]], dtype=torch.float64)
    curve = StreamingCurve(fractions=(0.25, 0.5), delta_nll={"taxonomy": torch.tensor([0.05, 0.2]), "random": random,
                                                             "oracle": torch.tensor([0.01, 0.1])},
                           orders={}, needs={}, baseline_nll=2.0, settings={"sink": 4, "window": 64, "seq_len": 256})
    fig = streaming_plot(curve)
    band, *lines = fig.data
    assert list(band.x) == [0.25, 0.5, 0.5, 0.25]
    assert list(band.y) == pytest.approx([0.2, 0.5, 0.3, 0.0])  # the largest over seeds there, the smallest back
    expected = {"taxonomy": [0.05, 0.2], "random (mean)": [0.1, 0.4], "oracle": [0.01, 0.1]}
    assert [trace.name for trace in lines] == list(expected)
    for trace in lines:
        assert list(trace.y) == pytest.approx(expected[trace.name])
    oracle = next(trace for trace in lines if trace.name == "oracle")
    assert oracle.line.dash == "dot"
    assert "sink 4 + window 64 of 256 tokens" in fig.layout.title.text


def test_topn_lines_follow_n_with_the_thresholds_marked():
    kept = TopNDeletion(n=(1, 4, 16), delta_nll=torch.tensor([0.5, 0.08, 0.004]), baseline_nll=2.0,
                        renormalise=False, smallest_n={})
    renormalised = TopNDeletion(n=(1, 4, 16), delta_nll=torch.tensor([0.3, 0.02, 0.001]), baseline_nll=2.0,
                                renormalise=True, smallest_n={})
    fig = topn_plot([kept, renormalised])
    assert [(trace.name, list(trace.x), list(trace.y)) for trace in fig.data] == [
        ("weights kept", [1, 4, 16], pytest.approx([0.5, 0.08, 0.004])),
        ("renormalised", [1, 4, 16], pytest.approx([0.3, 0.02, 0.001]))]
    assert sorted(shape.y0 for shape in fig.layout.shapes) == [0.01, 0.05, 0.10]
    assert len(topn_plot(kept).data) == 1  # one result alone

