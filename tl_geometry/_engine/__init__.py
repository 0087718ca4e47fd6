"""The compute engine: every compiled (numba) kernel of the package, behind one door.

Arrays in, arrays out: callers hand numpy arrays (views of CPU tensors) in the named bundles of
:mod:`.bundles` and get their outputs written in place. Nothing outside this package imports
numba, and it imports nothing of the package above it. Modules, one job each:

- ``bundles``: the named inputs, settings and outputs the kernels take;
- ``options``: the compile options the kernels share;
- ``threads``: numba's pool, sized on first use, and each parallel kernel's team;
- ``float_env``: whether a thread flushes subnormals to zero (the certificates assume it does not);
- ``disk_cache``: numba's on-disk cache (an index another layout of the package wrote is cleared
  on import, so numba recompiles instead of failing to read it);
- ``rows``: one row's checks, its selection by a ranking, its winner;
- ``metrics``: the top-N metrics of a row N by N (and the sink-excluded F);
- ``certificates``: their certificates (lower bounds on P and R);
- ``random_stream``: the counter-based random rankings;
- ``pairs``: value statistics (float64 squared norms, the sink's products, pair cosines);
- ``separability``: the separability driver (chosen rows of any pattern);
- ``layer``: the layer pass of the analysis (every measure of one layer in one walk).
"""

from __future__ import annotations

import numpy as np

from . import certificates as _certificates
from . import float_env as _float_env
from . import layer as _layer
from . import metrics as _metrics
from . import pairs as _pairs
from . import random_stream as _random
from . import rows as _rows
from . import separability as _separability
from .bundles import (
    Certificates,
    LayerOutputs,
    LayerPlan,
    LayerRows,
    Metrics,
    RowChecks,
    Rule,
    SeparabilityRows,
    Sink,
    Tallies,
    Values,
    integer_like,
)
from .disk_cache import clear_unreadable_indexes
from .disk_cache import kernels_cached as _kernels_cached
from .float_env import flushes_subnormals
from .metrics import COS_EPS
from .random_stream import GOLDEN, HEAD, MIX, QUERY
from .threads import team

__all__ = [
    "Values", "Rule", "Metrics", "RowChecks", "SeparabilityRows", "Sink", "LayerRows", "LayerPlan", "Tallies", "Certificates", "LayerOutputs",
    "integer_like", "COS_EPS", "GOLDEN", "MIX", "HEAD", "QUERY",
    "separability_rows", "layer_rows", "random_top_orders", "pair_cosine_statistics",
    "squared_norms", "sink_products", "norms_from_squares", "kernels_cached", "flushes_subnormals",
]


# Every module with cached kernels (tests/engine/test_disk_cache.py checks the list).
KERNEL_MODULES = (_metrics, _certificates, _rows, _random, _pairs, _separability, _layer, _float_env)
clear_unreadable_indexes(KERNEL_MODULES)


def kernels_cached() -> bool:
    """Whether the layer pass's machine code is in numba's on-disk cache (else the first call
    compiles it: once per installation, about a minute)."""
    return _kernels_cached(_layer.layer_rows)


def separability_rows(inputs: SeparabilityRows, values: Values, rule: Rule, metrics: Metrics, checks: RowChecks) -> None:
    """The top-N metrics and row checks of every row of ``inputs.rows`` into ``metrics``, ``checks``."""
    with team(inputs.rows.size):
        _separability.separability_rows(inputs, values, rule, metrics, checks)


def layer_rows(rows: LayerRows, values: Values, rule: Rule, plan: LayerPlan, out: LayerOutputs) -> None:
    """Every measure of one layer (or a block of its sequences and kv heads) into ``out``."""
    batch, heads, n_q, n_k = rows.pattern.shape
    visited = n_q if (plan.geometry_all or plan.taxonomy_all) else 1
    with team(batch * heads * visited * n_k):
        _layer.layer_rows(rows, values, rule, plan, *out)


def random_top_orders(keys: np.ndarray, key_mask: np.ndarray, qpos: np.ndarray, qvalid: np.ndarray,
                      exclude_sink: bool, window: int, out: np.ndarray) -> None:
    """The random rankings' best sources ``out[repeat, batch, head, q, :max_n]``, as the layer pass
    draws them (``keys`` ``[batch]`` uint64; ``window`` as ``Rule.window``)."""
    with team(out.shape[1] * out.shape[2] * out.shape[3] * key_mask.shape[1]):
        _random.random_top_orders(keys, key_mask, qpos, qvalid, exclude_sink, window, out)


def pair_cosine_statistics(gram: np.ndarray, norms: np.ndarray, nonsink: np.ndarray, newest: np.ndarray,
                           largest: np.ndarray, total: np.ndarray) -> None:
    """|cos| over non-sink pairs from the Gram matrices (see ``pairs.pair_cosine_statistics``)."""
    with team(gram.size):
        _pairs.pair_cosine_statistics(gram, norms, nonsink, integer_like(gram.itemsize), newest, largest, total)


squared_norms = _pairs.squared_norms
sink_products = _pairs.sink_products
norms_from_squares = _pairs.norms_from_squares
