"""A separability job (measure/separability_job.py): distinct sorted N and the chosen rows, prepared once for either backend."""

from __future__ import annotations

import pytest
import torch

from tl_geometry.errors import TLGeometryError
from tl_geometry.measure.separability_job import prepare_separability

from ..inputs import softmax_rows


def test_job_holds_distinct_sorted_n_and_the_chosen_rows():
    pattern = softmax_rows(torch.float32)
    v = torch.randn(2, 48, 2, 4)
    job = prepare_separability(pattern, v, (8, 2, 8, 1), distance="cosine", ranking="attention", queries="last",
                               exclude_sink=True, key_mask=None, query_mask=None)
    assert job.ns == (1, 2, 8) and job.group == 1 and not job.all_rows
    assert job.qpos.tolist() == [[47], [47]] and job.dtype == torch.float32 and job.query_valid.all()
    with pytest.raises(TLGeometryError, match="distance"):
        prepare_separability(pattern, v, (1,), distance="manhattan", ranking="attention", queries="all",
                             exclude_sink=False, key_mask=None, query_mask=None)
