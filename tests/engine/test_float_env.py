"""The threads' floating-point environment (_engine/float_env.py): flush-to-zero seen on the
calling thread, and gone once it is switched off."""

from __future__ import annotations

import pytest
import torch

from tl_geometry._engine import flushes_subnormals


def test_flush_to_zero_is_seen_and_its_end_too():
    assert not flushes_subnormals()
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormals")
    try:
        assert flushes_subnormals()
    finally:
        torch.set_flush_denormal(False)
    assert not flushes_subnormals()
