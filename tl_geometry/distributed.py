"""Sharding windows across processes with ``torch.distributed`` (torchrun, any backend).

Every result is a set of per-window values plus vote counts, and the random baseline is seeded per
(run seed, window, layer), so a run split into shards and merged equals the single-process run.
Rank ``r`` of ``K`` takes windows ``r, r + K, r + 2K, …``; the shards meet with two collectives
(``all_reduce`` of the vote counts, ``all_gather_object`` of the per-window tensors).

Example (2 processes on CPU)::

    torchrun --nproc_per_node 2 "$(command -v tl-geometry)" analyze --windows 64
"""

from __future__ import annotations

import os
from typing import Any

import torch

__all__ = ["world", "init_from_env", "shard_indices", "gather_analysis"]


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


def gather_analysis(analysis: Any) -> Any:
    """Merge the shards of every rank into the result of one run over all windows (on every rank)."""
    import torch.distributed as dist

    from .analysis import Analysis

    rank, size = world()
    if size == 1:
        return analysis
    votes, offsets = analysis.taxonomy.votes.clone(), analysis.taxonomy.offsets.clone()
    dist.all_reduce(votes)
    dist.all_reduce(offsets)
    shards: list[Any] = [None] * size
    geo = analysis.geometry
    dist.all_gather_object(shards, (geo.per_sequence, geo.window_ids))
    merged = None
    for per_sequence, ids in shards:
        if ids.numel() == 0:
            continue
        part = type(geo)(geo.n, per_sequence, ids, dict(geo.settings))
        merged = part if merged is None else merged.merge(part)
    merged.settings["n_windows"] = int(merged.window_ids.numel())
    merged.settings["world_size"] = size
    taxonomy = type(analysis.taxonomy)(votes, offsets, dict(analysis.taxonomy.settings, world_size=size))
    return Analysis(merged, taxonomy)
