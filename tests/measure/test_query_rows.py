"""Argument checks and row preparation: dtype-fitted row checks, the job contract, one error type."""

from __future__ import annotations

import pytest
import torch

from tests.oracle import oracle_separability
from tl_geometry.errors import TLGeometryError
from tl_geometry.measure.metrics import separability
from tl_geometry.measure.query_rows import query_rows, row_sum_tolerance
from tl_geometry.measure.separability_job import prepare_separability


def _softmax_rows(dtype, batch=2, heads=2, pos=48, seed=0):
    """Causal softmax rows computed in ``dtype`` (as a model running in it writes hook_pattern)."""
    gen = torch.Generator().manual_seed(seed)
    scores = (3 * torch.randn(batch, heads, pos, pos, generator=gen)).to(dtype)
    causal = torch.ones(pos, pos, dtype=torch.bool).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1)


def test_row_sum_tolerance_is_fitted_to_the_dtype():
    assert row_sum_tolerance(torch.float32) == row_sum_tolerance(torch.float64) == 1e-3
    assert row_sum_tolerance(torch.float16) == 4 * 2.0 ** -10
    assert row_sum_tolerance(torch.bfloat16) == 4 * 2.0 ** -7


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_narrow_dtype_softmax_rows_are_accepted_and_measured_exactly(dtype, backend):
    pattern = _softmax_rows(dtype)
    v = torch.randn(2, 48, 1, 8, generator=torch.Generator().manual_seed(1)).to(dtype)
    off = float((pattern.double().sum(-1) - 1).abs().max())
    if dtype == torch.bfloat16:
        assert off > 1e-3  # a float32 tolerance would refuse the model's own softmax
        with pytest.raises(TLGeometryError, match="do not sum to 1"):
            separability(pattern.float(), v.float(), 2, backend=backend)
    sep = separability(pattern, v, (1, 2, 4), backend=backend)
    ref = oracle_separability(pattern, v, (1, 2, 4))
    for name in ("precision", "recall", "f"):
        torch.testing.assert_close(getattr(sep, name).double(), ref[name], equal_nan=True, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_raw_scores_are_still_refused_in_every_dtype(dtype):
    pattern = _softmax_rows(dtype) * 1.2  # rows sum to 1.2: not a softmax
    v = torch.randn(2, 48, 1, 8).to(dtype)
    with pytest.raises(TLGeometryError, match="do not sum to 1"):
        separability(pattern, v, 2)
    with pytest.raises(TLGeometryError, match="do not sum to 1"):
        query_rows(pattern, v)


def test_job_holds_distinct_sorted_n_and_the_chosen_rows():
    pattern = _softmax_rows(torch.float32)
    v = torch.randn(2, 48, 2, 4)
    job = prepare_separability(pattern, v, (8, 2, 8, 1), distance="cosine", ranking="attention", queries="last",
                               exclude_sink=True, key_mask=None, query_mask=None)
    assert job.ns == (1, 2, 8) and job.group == 1 and not job.all_rows
    assert job.qpos.tolist() == [[47], [47]] and job.dtype == torch.float32 and job.query_valid.all()
    with pytest.raises(TLGeometryError, match="distance"):
        prepare_separability(pattern, v, (1,), distance="manhattan", ranking="attention", queries="all",
                             exclude_sink=False, key_mask=None, query_mask=None)


def test_user_errors_are_one_type_and_still_value_errors():
    pattern = _softmax_rows(torch.float32)
    with pytest.raises(TLGeometryError) as info:
        separability(pattern, torch.randn(2, 48, 3, 4), 1)  # 3 kv heads do not divide 2 heads
    assert isinstance(info.value, ValueError) and "kv heads" in str(info.value)
