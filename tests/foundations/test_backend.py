"""The one backend choice: what "auto" picks, and what is refused with one clear line."""

from __future__ import annotations

import pytest
import torch

from tl_geometry.backend import on_engine, resolve_backend
from tl_geometry.errors import TLGeometryError


def test_auto_is_the_engine_on_the_cpu_and_torch_elsewhere():
    assert resolve_backend("auto", torch.device("cpu")) == "numba"
    assert resolve_backend("auto", torch.device("meta")) == "torch"
    assert resolve_backend("torch", torch.device("cpu")) == "torch"


@pytest.mark.ill_typed
def test_an_unknown_backend_and_the_engine_off_the_cpu_are_refused():
    with pytest.raises(TLGeometryError, match="backend must be 'auto', 'numba' or 'torch'; got 'fused'"):
        resolve_backend("fused", torch.device("cpu"))
    with pytest.raises(TLGeometryError, match="runs on CPU tensors; these are on meta"):
        resolve_backend("numba", torch.device("meta"))


def test_the_engine_takes_cpu_float32_and_float64_only():
    assert on_engine(torch.zeros(2)) and on_engine(torch.zeros(2, dtype=torch.float64))
    assert not on_engine(torch.zeros(2, dtype=torch.bfloat16)) and not on_engine(torch.zeros(2, device="meta"))
