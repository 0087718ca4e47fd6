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
    table = res.heads_table(heads=chosen, extra={"patch": patch, "flat": patch.flatten().numpy()}, all_columns=True)
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


def test_the_default_table_is_readable_and_all_columns_keep_everything():
    """At most 14 columns by default (the label, its meaning and evidence, head type, sink, two
    gaps), Euclidean N = 1 not among the gaps (0 by definition); every column on request."""
    from tl_geometry.label.taxonomy import REGIME_MEANING

    model, tokens = tiny_model(4, 2), random_tokens(2, 10, seed=2)
    res = tlg.analyze(model, tokens, (1, 2, 4), repeats=2, bootstrap=5, progress=False)
    default, full = res.heads_table(), res.heads_table(all_columns=True)
    assert len(default.columns) <= 14 and set(default.columns) <= set(full.columns)
    assert list(default.columns) == ["name", "regime", "meaning", "share", "share_low", "share_high", "n_votes",
                                     "label_uncertain", "head_type", "dominant_offset", "sink_mass", "norm_ratio",
                                     "gap@2", "gap@4"]
    assert [REGIME_MEANING[r] for r in default["regime"]] == default["meaning"].tolist()
    assert (default["share"] == full[["share_current", "share_sink", "share_other"]].max(axis=1)).all()
    for column in ("f_top@1", "f_random@1", "f_nosink@1"):
        assert (full[column] == 1).all(), column
    assert (full["gap@1"] == 0).all()
    cosine = tlg.analyze(model, tokens, (1, 2), distance="cosine", repeats=2, bootstrap=5, progress=False)
    assert [c for c in cosine.heads_table().columns if c.startswith("gap@")] == ["gap@1", "gap@2"]


def test_a_per_kv_head_tensor_joins_by_the_models_grouping():
    """Under GQA (4 query heads, 2 kv heads) a [n_layers, n_kv_heads] tensor gives each query head
    its kv head's value (h // 2), in the table, regime means and the head map, and says so."""
    res = tlg.analyze(tiny_model(4, 2), random_tokens(2, 10, seed=3), (1, 2), repeats=1, bootstrap=5, progress=False)
    layers, heads = res.taxonomy.shape
    per_kv = torch.arange(layers * 2, dtype=torch.float64).reshape(layers, 2)
    expanded = torch.stack([per_kv[:, h // 2] for h in range(heads)], 1)
    table = res.heads_table(extra={"k_patch": per_kv, "flat_kv": per_kv.flatten()})
    assert table["k_patch"].tolist() == expanded.flatten().tolist() == table["flat_kv"].tolist()
    assert "k_patch, flat_kv: one value per kv head" in table.attrs["per_kv_head"]
    assert res.regime_means(per_kv).equals(res.regime_means(expanded))
    heat = tlg.plots.head_map(res, per_kv, title="per kv").data[0]
    assert heat.z == tuple(tuple(row) for row in expanded.tolist()) or list(map(list, heat.z)) == expanded.tolist()
    with pytest.raises(TLGeometryError, match=r"or per kv head \[3, 2\]; got shape \[3, 3\]"):
        res.heads_table(extra={"x": torch.zeros(layers, 3)})
    assert "per_kv_head" not in res.heads_table(extra={"q": expanded}).attrs
