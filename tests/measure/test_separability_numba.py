"""The numba backend of separability (measure/separability_numba.py): Gram blocks and direct products change no value."""

from __future__ import annotations

import pytest
import torch

from tl_geometry.measure import separability_job
from tl_geometry.measure.metrics import separability

from ..inputs import random_attention
from ..oracle import assert_same_separability


@pytest.mark.parametrize("gram_bytes", [1, 2 * 16 * 16 * 8])  # one (sequence, kv head) per block; one sequence
def test_numba_gram_blocks_change_nothing(monkeypatch, gram_bytes):
    pattern, v, mask = random_attention(3, 4, 2, 16, seed=3, lengths=[16, 9, 12])
    whole = separability(pattern, v, (1, 4, 9), key_mask=mask, query_mask=mask, backend="numba")
    monkeypatch.setattr(separability_job, "GRAM_BYTES", gram_bytes)
    assert len(separability_job.gram_blocks(3, 2, 16 * 16 * 8)) == (6 if gram_bytes == 1 else 3)  # blocks, not one
    assert_same_separability(whole, separability(pattern, v, (1, 4, 9), key_mask=mask, query_mask=mask, backend="numba"))


def test_numba_direct_products_equal_gram_updates():
    """A few query rows take ⟨v_k, s_N⟩ directly; every row takes them from the Gram matrix."""
    pattern, v, mask = random_attention(3, 4, 2, 16, seed=5, lengths=[16, 9, 12])
    positions = torch.tensor([2, 15])  # 2 heads per kv head × 2 rows × 3 N < 16 keys: direct
    every = separability(pattern, v, (1, 2, 3), key_mask=mask, query_mask=mask, backend="numba")
    few = separability(pattern, v, (1, 2, 3), queries=positions, key_mask=mask, query_mask=mask, backend="numba")
    for name in ("precision", "recall", "f", "margin", "inversions", "sink_selected"):
        torch.testing.assert_close(getattr(few, name), getattr(every, name)[:, :, positions], equal_nan=True,
                                   atol=1e-12, rtol=0, msg=name)
