"""The one exception type for user errors (errors.py): a ValueError, so existing handlers still
catch it, raised by the public functions for input the caller can fix."""

from __future__ import annotations

import pytest
import torch

from tl_geometry.errors import TLGeometryError
from tl_geometry.measure.metrics import separability

from ..inputs import softmax_rows


def test_user_errors_are_one_type_and_still_value_errors():
    pattern = softmax_rows(torch.float32)
    with pytest.raises(TLGeometryError) as info:
        separability(pattern, torch.randn(2, 48, 3, 4), 1)  # 3 kv heads do not divide 2 heads
    assert isinstance(info.value, ValueError) and "kv heads" in str(info.value)
    with pytest.raises(ValueError):  # what code written before the type existed catches
        separability(pattern, torch.randn(2, 48, 3, 4), 1)
