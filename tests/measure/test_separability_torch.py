"""The torch backend of separability (measure/separability_torch.py): chunking over queries changes no value."""

from __future__ import annotations

from tl_geometry.measure.metrics import separability

from ..inputs import random_attention
from ..oracle import assert_same_separability


def test_chunking_over_queries_changes_nothing():
    pattern, v, _ = random_attention(2, 4, 2, 16, seed=3)
    whole = separability(pattern, v, (1, 4, 9), backend="torch")
    assert_same_separability(whole, separability(pattern, v, (1, 4, 9), chunk_elements=1, backend="torch"))
