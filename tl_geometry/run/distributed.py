"""Sharding windows across processes with ``torch.distributed`` (torchrun, any backend).

Every result is a set of per-window values plus vote counts, and the random baseline is seeded per
(run seed, window, layer), so a run split into shards and merged equals the single-process run.
Rank ``r`` of ``K`` takes windows ``r, r + K, r + 2K, …``; the shards meet with two collectives
(:func:`all_reduce` of the vote counts, :func:`all_gather_objects` of the per-window tensors),
which ``tl_geometry.run.analysis`` uses to merge them. This module knows only the process group.

Example (2 processes on CPU)::

    torchrun --nproc_per_node 2 "$(command -v tl-geometry)" analyze --windows 64
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

__all__ = ["world", "init_from_env", "shard_indices", "shard_path", "my_shard", "barrier", "all_reduce", "all_gather_objects"]


def world() -> tuple[int, int]:
    """``(rank, world_size)``; ``(0, 1)`` outside an initialised process group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_from_env(backend: str | None = None) -> tuple[int, int]:
    """Join the process group that ``torchrun`` describes in the environment (``WORLD_SIZE`` > 1);
    ``gloo`` on CPU, ``nccl`` when CUDA is available. A no-op in a plain process."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and dist.is_available() and not dist.is_initialized():
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(backend)
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    return world()


def shard_indices(n_windows: int, rank: int, world_size: int) -> torch.Tensor:
    """Windows of one rank: ``rank, rank + world_size, …`` (balanced to within one window)."""
    return torch.arange(rank, n_windows, world_size)


def shard_path(path: str | Path, rank: int, world_size: int) -> Path:
    """The file of one rank's own state (``name.rank{r}.ext``), or ``path`` itself in one process."""
    path = Path(path)
    return path if world_size <= 1 else path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def my_shard(n_windows: int, checkpoint: str | Path | None) -> tuple[torch.Tensor, Path | None] | None:
    """This rank's windows and its own checkpoint file when an initialised process group has several
    ranks; ``None`` in one process (every window is this process's)."""
    rank, world_size = world()
    if world_size <= 1:
        return None
    return shard_indices(n_windows, rank, world_size), None if checkpoint is None else shard_path(checkpoint, rank, world_size)


def barrier() -> None:
    """Wait until every rank gets here (a no-op in one process)."""
    import torch.distributed as dist

    if world()[1] > 1:
        dist.barrier()


def all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum of ``tensor`` over the ranks (in place; returned)."""
    import torch.distributed as dist

    dist.all_reduce(tensor)
    return tensor


def all_gather_objects(value: Any) -> list[Any]:
    """``value`` of every rank, in rank order."""
    import torch.distributed as dist

    out: list[Any] = [None] * world()[1]
    dist.all_gather_object(out, value)
    return out
