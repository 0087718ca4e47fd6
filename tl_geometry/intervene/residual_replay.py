"""Loss evaluations that start where they change.

Every "change some heads, measure the loss" job (pruning curves, the single-head scan, top-N
deletion, streaming orders and their oracle) evaluates many sets of hooks on one set of windows.
A forward whose hooks touch only layers ``l`` and above computes exactly the baseline's residual
stream below ``l``; :class:`ReplayedForwards` keeps the residual entering each layer from one
baseline forward and, for each evaluation, replaces blocks ``0 .. l−1`` by that recording (for
that forward only), so the evaluation runs blocks ``l ..`` and the unembedding. It works on both
model classes alike: the model's own forward runs, only the called blocks' ``forward`` is swapped.

Memory: one ``[windows, pos, d_model]`` tensor per kept layer in the model's dtype. Where every
layer does not fit in ``memory`` bytes, evenly spaced layers are kept and an evaluation starts at
the nearest kept layer below its first change; where none fits, evaluations are full forwards.
docs/performance.md gives the figures.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..capture.adapters import sequence_nll
from ..capture.model_info import describe_model
from ..errors import TLGeometryError

__all__ = ["DEFAULT_REPLAY_MEMORY", "ReplayedForwards", "first_changed_layer", "token_mean"]

# Residual recordings kept per job: 2 GiB holds every layer of SmolLM2 for 64 windows × 256 tokens.
DEFAULT_REPLAY_MEMORY = 2 * 1024**3
_BLOCK_HOOK = re.compile(r"^blocks\.(\d+)\.")

Hooks = list[tuple[Any, Callable]]


def first_changed_layer(fwd_hooks: Iterable[tuple[Any, Callable]], n_layers: int) -> int:
    """The lowest layer a set of forward hooks can change: the smallest ``blocks.{l}.`` of their
    names; 0 where a hook sits outside the blocks (or is a name filter); ``n_layers`` for none."""
    first = n_layers
    for name, _ in fwd_hooks:
        match = _BLOCK_HOOK.match(name) if isinstance(name, str) else None
        if match is None:
            return 0
        first = min(first, int(match.group(1)))
    return first


def token_mean(sums: Iterable[tuple[Tensor, Tensor]]) -> float:
    """Token-averaged NLL from (summed NLL, predicted tokens) pairs, e.g. per batch; refuses none predicted."""
    total, count = 0.0, 0.0
    for nll, n in sums:
        total, count = total + float(nll.sum()), count + float(n.sum())
    if count == 0:
        raise TLGeometryError("no predicted token: windows need at least two real tokens.")
    return total / count


def _kept_layers(n_layers: int, per_layer: int, memory: int) -> list[int]:
    """Layers ``j ≥ 1`` whose input is recorded: all where they fit, else every ``stride``-th."""
    fit = memory // max(per_layer, 1)
    if fit < 1 or n_layers < 2:
        return []
    stride = math.ceil((n_layers - 1) / fit)
    return list(range(stride, n_layers, stride))


class ReplayedForwards:
    """Summed next-token NLL of ``tokens`` under sets of hooks, each forward starting at the first
    layer its hooks change (from the residual a baseline forward recorded there).

    The baseline forward runs once, at construction: :attr:`baseline_nll` (token mean) and per
    window sums. :meth:`nll` evaluates any rows (windows, repeated as the caller likes);
    :meth:`mean_nll` all windows in batches. Results equal full forwards (the layers below the
    first change compute the recorded residual; tests compare both routes).
    """

    def __init__(self, model: Any, tokens: Int[Tensor, "batch pos"], attention_mask: Int[Tensor, "batch pos"] | None = None,
                 *, batch_size: int = 8, memory: int = DEFAULT_REPLAY_MEMORY):
        info = describe_model(model)
        self.model, self.tokens, self.mask, self.batch_size = model, tokens, attention_mask, batch_size
        self.n_layers = info.n_layers
        self.blocks = list(model.blocks)
        itemsize = torch.empty((), dtype=next(model.parameters()).dtype).element_size()
        self.per_layer = int(tokens.shape[0] * tokens.shape[1] * model.cfg.d_model * itemsize)
        self.kept = _kept_layers(self.n_layers, self.per_layer, memory)
        self.inputs: dict[int, Tensor] = {}
        self.extras: tuple | None = None  # a block that returns a tuple: its other (empty) entries
        window_nll = torch.zeros(tokens.shape[0], dtype=torch.float64)
        window_count = torch.zeros(tokens.shape[0], dtype=torch.float64)
        for rows in self._batches():
            with self._recording(rows):
                nll, count = self._forward(rows, [])
            window_nll[rows], window_count[rows] = nll, count.double()
        self.window_nll, self.window_count = window_nll, window_count
        self.baseline_nll = token_mean([(window_nll, window_count)])

    @property
    def memory(self) -> int:
        """Bytes of the recorded residuals."""
        return self.per_layer * len(self.kept)

    def start_layer(self, fwd_hooks: Hooks) -> int:
        """The layer an evaluation under ``fwd_hooks`` starts at: the nearest recorded one at or
        below the first layer they change (0: a full forward)."""
        first = first_changed_layer(fwd_hooks, self.n_layers)
        return max((j for j in self.kept if j <= first), default=0)

    def nll(self, rows: Int[Tensor, " rows"], fwd_hooks: Hooks) -> tuple[Float[Tensor, " rows"], Int[Tensor, " rows"]]:
        """Summed NLL and predicted tokens of windows ``rows`` (any order, repeats allowed) under
        ``fwd_hooks``, in one forward from :meth:`start_layer`."""
        if first_changed_layer(fwd_hooks, self.n_layers) == self.n_layers:
            return self.window_nll[rows].clone(), self.window_count[rows].long()
        with self._replaying(self.start_layer(fwd_hooks), rows):
            return self._forward(rows, fwd_hooks)

    def mean_nll(self, fwd_hooks: Hooks) -> float:
        """Token-averaged NLL of every window under ``fwd_hooks`` (batches of ``batch_size``)."""
        return token_mean(self.nll(rows, fwd_hooks) for rows in self._batches())

    def _batches(self) -> Iterator[Tensor]:
        for start in range(0, self.tokens.shape[0], self.batch_size):
            yield torch.arange(start, min(start + self.batch_size, self.tokens.shape[0]))

    def _forward(self, rows: Tensor, fwd_hooks: Hooks) -> tuple[Tensor, Tensor]:
        mask = None if self.mask is None else self.mask[rows]
        with torch.no_grad():
            return sequence_nll(self.model, self.tokens[rows], attention_mask=mask, fwd_hooks=fwd_hooks)

    @contextmanager
    def _recording(self, rows: Tensor) -> Iterator[None]:
        """Keep the output of block ``j − 1`` (the input of ``j``) of every kept ``j`` for ``rows``."""
        handles = []
        for j in self.kept:
            def record(module, args, output, j=j) -> None:
                hidden = self._hidden(output)
                if j not in self.inputs:
                    self.inputs[j] = hidden.new_empty((self.tokens.shape[0], *hidden.shape[1:]))
                self.inputs[j][rows.to(hidden.device)] = hidden.detach()

            handles.append(self.blocks[j - 1].register_forward_hook(record))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _hidden(self, output: Any) -> Tensor:
        """A block's residual output: the tensor, or the first entry of a tuple whose others are empty."""
        if isinstance(output, Tensor):
            return output
        if isinstance(output, tuple) and output and all(extra is None for extra in output[1:]):
            self.extras = output[1:]
            return output[0]
        raise TLGeometryError(f"a block of {type(self.model).__name__} returned {type(output).__name__}; "
                              "tl_geometry reads a residual tensor (or a 1-tuple) per block.")

    @contextmanager
    def _replaying(self, start: int, rows: Tensor) -> Iterator[None]:
        """Blocks ``0 .. start−1`` return the recorded input of block ``start`` for ``rows``."""
        if start == 0:
            yield
            return
        replay = self.inputs[start][rows.to(self.inputs[start].device)]
        output = replay if self.extras is None else (replay, *self.extras)

        def recorded(*args, **kwargs):
            return output

        # On the instance, past the bridge's own __setattr__ (which forwards names to the wrapped layer)
        swapped = self.blocks[:start]
        for block in swapped:
            object.__setattr__(block, "forward", recorded)
        try:
            yield
        finally:
            for block in swapped:
                object.__delattr__(block, "forward")
