"""DuoAttention patterns of streaming curves: the heads a reader of the pattern streams are the
curve's, the files round-trip exactly, and folders are never overwritten by surprise."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import tl_geometry as tlg
from tl_geometry.errors import TLGeometryError
from tl_geometry.intervene.duo_attention import DuoAttentionPattern, duo_attention_pattern
from tl_geometry.intervene.streaming import streaming_curve

from ..tiny import random_tokens, tiny_streamable

FRACTIONS = (1 / 6, 0.25, 0.5, 0.75, 1.0)


@pytest.fixture(scope="module")
def curve():
    model, tokens = tiny_streamable(4, 2, n_layers=3), random_tokens(2, 24, seed=3)
    analysis = tlg.analyze(model, tokens, (1, 2, 4), progress=False)
    return streaming_curve(model, tokens, analysis, fractions=FRACTIONS, window=4, sink=1, seeds=1,
                           orders=("taxonomy", "entropy", "oracle", "random"), progress=False)


def _kvpress_streams(folder, ratio):
    """What kvpress's DuoAttentionPress does with a pattern folder (its own reading and selection:
    ``np.loadtxt`` of the tsv, clipped, the ``round(ratio · n)`` smallest of ``argsort(axis=None)``)."""
    scores = np.clip(np.loadtxt(folder / "full_attention_heads.tsv", dtype=float, delimiter="\t"), 0, 1)
    mask = np.zeros(scores.shape, dtype=bool)
    n_pruned = round(scores.size * ratio)
    if n_pruned > 0:
        mask[np.unravel_index(np.argsort(scores, axis=None)[:n_pruned], scores.shape)] = True
    return torch.from_numpy(mask)


@pytest.mark.parametrize("order", [None, "taxonomy", "entropy", "oracle"])
def test_a_reader_of_the_pattern_streams_the_curves_heads_at_each_fraction(curve, order, tmp_path):
    pattern = duo_attention_pattern(curve, order)
    chosen = order or min((o for o in curve.orders if o != "random"), key=curve.area_to_oracle().get)
    assert pattern.order == chosen and (pattern.sink_size, pattern.recent_size) == (1, 4)
    folder = pattern.save(tmp_path / "duo")
    config = json.loads((folder / "config.json").read_text())
    assert (config["sink_size"], config["recent_size"], config["order"]) == (1, 4, chosen)
    n_kv = curve.settings["n_kv_total"]
    for fraction in FRACTIONS:
        streamed = torch.zeros(n_kv, dtype=torch.bool)
        streamed[curve.orders[chosen][:round(fraction * n_kv)]] = True  # what the curve streamed (flat layer·kv)
        expected = streamed.reshape(pattern.scores.shape)
        assert torch.equal(pattern.streamed(fraction), expected)
        assert torch.equal(_kvpress_streams(folder, fraction), expected)


def test_the_files_round_trip_exactly_and_damage_is_one_line(curve, tmp_path):
    pattern = duo_attention_pattern(curve, "taxonomy")
    folder = pattern.save(tmp_path / "duo")
    back = DuoAttentionPattern.load(folder)
    assert torch.equal(back.scores, pattern.scores) and back.order == "taxonomy"
    assert sorted(back.scores.flatten().tolist()) == [k / 5 for k in range(6)]  # distinct ranks: no tie for a sort
    for bad in ("0.1\t1.5\n0.2\t0.3\n", "0.1\tnan\n", "0.1\t0.2\n0.3\n", "a\tb\n", ""):
        (folder / "full_attention_heads.tsv").write_text(bad)
        with pytest.raises(TLGeometryError, match="one row per layer of scores in"):
            DuoAttentionPattern.load(folder)
    (folder / "config.json").write_text(json.dumps({"sink_size": 4, "recent_size": 0}))
    with pytest.raises(TLGeometryError, match="integer sink_size ≥ 0 and recent_size ≥ 1"):
        DuoAttentionPattern.load(folder)


def test_a_folder_is_replaced_only_when_asked_and_never_someone_elses(curve, tmp_path):
    pattern = duo_attention_pattern(curve, "oracle")
    folder = pattern.save(tmp_path / "duo")
    with pytest.raises(TLGeometryError, match="already holds a DuoAttention pattern: pass overwrite=True"):
        pattern.save(folder)
    duo_attention_pattern(curve, "taxonomy").save(folder, overwrite=True)
    assert DuoAttentionPattern.load(folder).order == "taxonomy"
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    with pytest.raises(TLGeometryError, match="holds files tl-geometry did not write"):
        pattern.save(theirs, overwrite=True)
    assert (theirs / "notes.txt").read_text() == "mine"
    (folder / "extra.txt").write_text("a file of the user's beside the pattern")
    with pytest.raises(TLGeometryError, match="holds files tl-geometry did not write"):
        pattern.save(folder, overwrite=True)
    assert (folder / "extra.txt").is_file()


def test_a_curve_without_orders_is_refused(curve):
    from tl_geometry.intervene.streaming import StreamingCurve

    read_back = StreamingCurve.from_dataframe(curve.to_dataframe())
    with pytest.raises(TLGeometryError, match="keeps no order of kv heads"):
        duo_attention_pattern(read_back)
    with pytest.raises(TLGeometryError, match="order 'echo_induction' was not measured"):
        duo_attention_pattern(curve, "echo_induction")
