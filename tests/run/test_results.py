"""An analysis' results (run/results.py): the heads table and its extra columns, regime means, columns fixed by the definition."""

from __future__ import annotations

import pytest
import torch

import tl_geometry as tlg
from tl_geometry.errors import TLGeometryError

from ..tiny import random_tokens, tiny_model


def test_extra_columns_join_by_head_and_regime_means_equal_a_groupby():
    res = tlg.analyze(tiny_model(4, 2), random_tokens(3, 10, seed=5), (1, 2), repeats=1, bootstrap=5, progress=False)
    layers, heads = res.taxonomy.shape
    patch = torch.arange(layers * heads, dtype=torch.float32).reshape(layers, heads) * 0.5 - 1
    patch[0, 1] = float("nan")
    chosen = ["L2H1", (0, 3), 4, "L1H0"]  # a subset, in an order of its own
    table = res.heads_table(heads=chosen, extra={"patch": patch, "flat": patch.flatten().numpy()})
    expected = [float(patch[layer, head]) for layer, head in zip(table["layer"], table["head"], strict=True)]
    assert table["name"].tolist() == ["L2H1", "L0H3", "L1H0", "L1H0"]
    assert torch.equal(torch.tensor(table["patch"].to_numpy()), torch.tensor(expected, dtype=torch.float64))
    assert table["flat"].equals(table["patch"])
    full = res.heads_table(extra={"patch": patch})
    grouped = full.groupby("regime")["patch"].agg(["count", "mean", "sum"])
    means = res.regime_means(patch)
    for regime in means.index:
        if regime in grouped.index:
            assert means.loc[regime].tolist() == pytest.approx(grouped.loc[regime].tolist(), nan_ok=True)
        else:  # no head of this regime: nothing counted
            assert means.loc[regime, "count"] == 0 and means.loc[regime, "sum"] == 0
    assert means["count"].sum() == layers * heads - 1  # the NaN head is skipped
    for bad, message in ((torch.zeros(heads, layers), r"\[n_layers, n_heads\] = \[3, 4\]"),
                         (torch.zeros(layers * heads + 1), "got shape"), (torch.ones(layers, heads).bool(), "booleans")):
        with pytest.raises(TLGeometryError, match=message):
            res.heads_table(extra={"x": bad})
        with pytest.raises(TLGeometryError, match=message):
            res.regime_means(bad)
    with pytest.raises(TLGeometryError, match="one of the table's own"):
        res.heads_table(extra={"regime": patch})


def test_dominant_offset_is_missing_where_a_head_has_no_other_vote():
    from tl_geometry.label.taxonomy import HeadTaxonomy

    res = tlg.analyze(tiny_model(4, 2), random_tokens(2, 8, seed=1), (1, 2), repeats=1, bootstrap=5, progress=False)
    offsets = torch.zeros_like(res.taxonomy.offsets)
    offsets[0, 0, 2] = 3  # one head with `other` votes two tokens back; none elsewhere
    tax = HeadTaxonomy(res.taxonomy.votes, offsets, res.taxonomy.settings, res.taxonomy.sinkless)
    column = tlg.Analysis(res.geometry, tax).heads_table()["dominant_offset"]
    assert str(column.dtype) == "Int64" and column.iloc[0] == 2 and column.iloc[1:].isna().all()


def test_columns_fixed_by_the_definition_only_on_request():
    """Euclidean N = 1: F of the aggregate itself is 1 (the gap 0) unless contributions coincide;
    cosine runs keep their N = 1 columns, which are measured."""
    from tl_geometry.run.results import FIXED_AT_ONE

    model, tokens = tiny_model(4, 2), random_tokens(2, 10, seed=2)
    res = tlg.analyze(model, tokens, (1, 2), repeats=2, bootstrap=5, progress=False)
    default, full = res.heads_table(), res.heads_table(all_columns=True)
    fixed = sorted(set(full.columns) - set(default.columns))
    assert fixed == sorted(f"{metric}@1" for metric in FIXED_AT_ONE)
    for column in ("f_top@1", "f_random@1", "f_nosink@1"):
        assert (full[column] == 1).all(), column
    assert (full["gap@1"] == 0).all() and {"f_top@2", "align_sink@1"} <= set(default.columns)
    cosine = tlg.analyze(model, tokens, (1, 2), distance="cosine", repeats=2, bootstrap=5, progress=False)
    assert list(cosine.heads_table().columns) == list(cosine.heads_table(all_columns=True).columns)
