"""The run configuration (config.py): every setting checked on construction with one clear error,
"auto" random rankings resolved as documented, what no window can measure said, and a lossless
round trip through the saved settings."""

from __future__ import annotations

import json

import pytest

from tl_geometry.config import RANDOM_DRAWS, RunConfig
from tl_geometry.errors import TLGeometryError


@pytest.mark.parametrize("bad, message", [
    ({"n": 0}, "n must be integers ≥ 1"), ({"n": (1, 2.0)}, "n must be integers"), ({"n": ()}, "n must be"),
    ({"n": (True,)}, "n must be"), ({"queries": "first"}, "queries must be one of 'last', 'all'"),
    ({"taxonomy_queries": "some"}, "taxonomy_queries must be"), ({"distance": "manhattan"}, "distance must be"),
    ({"ranking": "value"}, "ranking must be"), ({"repeats": -1}, "repeats must be 'auto' or an int ≥ 0"),
    ({"repeats": "many"}, "repeats must be"), ({"seed": -1}, "seed must be an int ≥ 0"),
    ({"bootstrap": 0}, "bootstrap must be an int ≥ 1"), ({"seed": True}, "seed must be"),
])
@pytest.mark.ill_typed  # the checks RunConfig makes itself, on values its annotations exclude
def test_bad_settings_are_one_clear_error(bad, message):
    with pytest.raises(TLGeometryError, match=message):
        RunConfig(**bad)


@pytest.mark.ill_typed
def test_a_single_n_becomes_a_tuple():
    assert RunConfig(n=4).n == (4,) and RunConfig(n=[8, 1]).n == (8, 1)  # the caller's order is kept


@pytest.mark.parametrize("queries, seq_len, expected", [
    ("last", 256, RANDOM_DRAWS), ("last", 2, RANDOM_DRAWS),
    ("all", 256, 1), ("all", 17, 1), ("all", 16, 2), ("all", 2, RANDOM_DRAWS), ("all", 5, 4),
])
def test_auto_repeats_give_at_least_16_draws_per_window_and_head(queries, seq_len, expected):
    repeats = RunConfig(queries=queries).random_repeats(seq_len)
    assert repeats == expected
    queries_drawn = 1 if queries == "last" else seq_len - 1  # queries 1..L-1 have ≥ 2 sources
    assert repeats * queries_drawn >= RANDOM_DRAWS
    assert RunConfig(queries=queries, repeats=3).random_repeats(seq_len) == 3  # an explicit count wins


def test_unmeasurable_n_and_the_reasons_follow_the_candidates():
    config = RunConfig(n=(1, 4, 8), repeats=0)
    assert config.unmeasurable_n(8) == (8,) and config.unmeasurable_n(9) == ()
    assert RunConfig(n=(1, 4, 8), exclude_sink=True).unmeasurable_n(9) == (8,)  # the sink is no candidate
    reasons = config.not_measurable(8)
    assert reasons[0].startswith("N = 8: not measurable, windows of 8 tokens give at most 8 candidate sources")
    assert "repeats = 0" in reasons[1]
    assert RunConfig(n=(1, 2)).not_measurable(256) == []


def test_settings_round_trip_through_json():
    config = RunConfig(n=(8, 1, 2), queries="all", distance="cosine", ranking="contribution", exclude_sink=True,
                       repeats=5, seed=7, bootstrap=10, sink=False)
    saved = json.loads(json.dumps({**config.to_dict(), "model": "provenance, not configuration"}))
    assert saved["n"] == [8, 1, 2]
    assert RunConfig.from_dict(saved) == config
    assert RunConfig.from_dict({}) == RunConfig()
