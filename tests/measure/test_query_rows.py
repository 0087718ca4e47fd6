"""Argument checks and row preparation: dtype-fitted row checks, the job contract, one error type."""

from __future__ import annotations

import pytest
import torch

from tests.oracle import oracle_separability
from tl_geometry.errors import TLGeometryError
from tl_geometry.measure.metrics import separability
from tl_geometry.measure.query_rows import query_rows, row_sum_tolerance

from ..inputs import softmax_rows


def test_row_sum_tolerance_is_fitted_to_the_dtype():
    assert row_sum_tolerance(torch.float32) == row_sum_tolerance(torch.float64) == 1e-3
    assert row_sum_tolerance(torch.float16) == 4 * 2.0 ** -10
    assert row_sum_tolerance(torch.bfloat16) == 4 * 2.0 ** -7


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("backend", ["numba", "torch"])
def test_narrow_dtype_softmax_rows_are_accepted_and_measured_exactly(dtype, backend):
    pattern = softmax_rows(dtype)
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
    pattern = softmax_rows(dtype) * 1.2  # rows sum to 1.2: not a softmax
    v = torch.randn(2, 48, 1, 8).to(dtype)
    with pytest.raises(TLGeometryError, match="do not sum to 1"):
        separability(pattern, v, 2)
    with pytest.raises(TLGeometryError, match="do not sum to 1"):
        query_rows(pattern, v)
