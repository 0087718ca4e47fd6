"""Selection (measure/selection.py): the top-N order is a stable descending sort."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tl_geometry.measure.selection import top_order


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0.0, -0.0, 0.25, 0.5, -1.5, 3e38, -3e38, float("inf"), float("-inf"), 1e-45]),
                min_size=1, max_size=40), st.integers(1, 40))
def test_top_order_equals_stable_descending_sort(values, m):
    score = torch.tensor(values, dtype=torch.float32).expand(3, -1)  # few distinct values: many ties
    m = min(m, len(values))
    expected = torch.sort(score, dim=-1, descending=True, stable=True).indices[..., :m]
    assert torch.equal(top_order(score, m), expected)
    assert torch.equal(top_order(score.double(), m), expected)  # the float64 path sorts
