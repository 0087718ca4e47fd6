"""Which implementation computes: the one backend choice, made here for every entry point.

``"numba"``: the compiled engine (``tl_geometry._engine``), for CPU tensors of float32 or
float64; ``"torch"``: vectorised torch code on any device; ``"auto"``: the engine where it
applies, torch elsewhere. Both implement the same definitions and give the same numbers (the
tests hold them to the loop oracle and to each other).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from .errors import TLGeometryError

__all__ = ["Backend", "resolve_backend", "on_engine"]

Backend = Literal["auto", "numba", "torch"]


def on_engine(tensor: Tensor) -> bool:
    """Whether the compiled engine can take ``tensor`` as it is (a CPU tensor, float32/float64)."""
    return tensor.device.type == "cpu" and tensor.dtype in (torch.float32, torch.float64)


def resolve_backend(backend: Backend, device: torch.device) -> Literal["numba", "torch"]:
    """``backend`` for tensors on ``device``: ``"auto"`` is the engine on the CPU, torch elsewhere."""
    if backend not in ("auto", "numba", "torch"):
        raise TLGeometryError(f"backend must be 'auto', 'numba' or 'torch'; got {backend!r}.")
    if backend == "numba" and device.type != "cpu":
        raise TLGeometryError(f"backend='numba' runs on CPU tensors; these are on {device}. Use backend='auto'.")
    if backend == "auto":
        return "numba" if device.type == "cpu" else "torch"
    return backend
