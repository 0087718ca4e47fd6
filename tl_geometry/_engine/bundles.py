"""The named bundles the compiled kernels take: inputs, settings, outputs and per-task scratch.

numba passes a ``NamedTuple`` of arrays as one argument (a struct of pointers: no copy), so a
kernel reads ``values.gram`` where it once took its 23rd positional argument. Every array is a
whole array indexed by ``(sequence, head, query, ...)``, never a row view: a view is a new
reference-counted object per call (see docs/design.md, "The engine").
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Values", "Rule", "SeparabilityRows", "Metrics", "RowChecks", "Sink", "LayerRows", "LayerPlan", "Tallies", "Certificates", "LayerOutputs",
           "integer_like"]


class Values(NamedTuple):
    """One layer's values, prepared once for every row that reads them.

    ``vectors`` ``[batch, kv, key, d]`` (float32 or float64); ``squares`` ``[batch, kv, key]``
    their float64 squared norms; ``norms64`` ``‖v‖`` (float64, one correctly rounded square root
    of ``squares``) for the contribution ranking and Theorem 2's weights, where either is asked for; ``gram`` ``[batch, kv, key, key]`` the Gram
    matrices ``V Vᵀ``, read only when ``Rule.use_gram``."""

    vectors: np.ndarray
    squares: np.ndarray
    norms64: np.ndarray
    gram: np.ndarray


class Rule(NamedTuple):
    """How rows are selected and measured: ``ns`` the distinct N, increasing (output column
    ``j`` holds ``ns[j]``); ``ranking`` 0 attention, 1 contribution ``α‖v‖``, 2 the caller's
    scores; query head ``h`` reads kv head ``h // group``; ``use_gram``: ``⟨v_k, s_N⟩`` from
    Gram rows, else from direct products; ``window`` the layer's sliding window (query ``t``
    sees keys ``t − window + 1 .. t``; 0: its whole causal prefix, ``rows.first_visible``)."""

    ns: np.ndarray
    ranking: int
    exclude_sink: bool
    euclidean: bool
    use_gram: bool
    group: int
    window: int


class Metrics(NamedTuple):
    """The top-N metrics ``[batch, head, q, n]``, pre-filled with NaN (``sink_selected``: False)."""

    precision: np.ndarray
    recall: np.ndarray
    f: np.ndarray
    margin: np.ndarray
    inversions: np.ndarray
    sink_selected: np.ndarray


class RowChecks(NamedTuple):
    """Per row ``[batch, head, query]`` (float64): the row's sum, its number of negative entries
    and its mass on the visible keys, for ``query_rows.check_distribution``."""

    total: np.ndarray
    negatives: np.ndarray
    visible: np.ndarray


class Sink(NamedTuple):
    """The sink diagnostics of the layer pass: ``mass``, ``rank`` ``[batch, head, q]``; per N
    ``[batch, head, q, n]``: ``align_sink`` = cos(s_N, v_0), ``align_current`` = cos(s_N, v_t) and
    ``f_nosink`` (F with key 0 removed from the candidates)."""

    mass: np.ndarray
    rank: np.ndarray
    align_sink: np.ndarray
    align_current: np.ndarray
    f_nosink: np.ndarray


class LayerRows(NamedTuple):
    """The layer pass' inputs besides the values: ``pattern`` ``[batch, head, query, key]``;
    ``key_mask``, ``query_mask`` ``[batch, pos]``; ``last`` ``[batch]`` the last real query;
    ``norms`` ``[batch, kv, key]`` the taxonomy's ``‖v‖`` (the pattern's dtype);
    ``certificates`` ``[2, len(CERTIFICATE_KEYS), batch, kv, key]`` the Gram bounds and slack scales of Theorems 1 and 2 at each query
    (``certificates.CERTIFICATE_KEYS``); ``random_keys`` ``[batch]`` (uint64, one per window and layer)."""

    pattern: np.ndarray
    key_mask: np.ndarray
    query_mask: np.ndarray
    last: np.ndarray
    norms: np.ndarray
    certificates: np.ndarray
    random_keys: np.ndarray


class LayerPlan(NamedTuple):
    """What the layer pass computes: geometry / taxonomy votes at every query (else the last);
    ``n_random`` random rankings per measured row; the sink diagnostics; the certificates; the
    row-sum ``tolerance``; ``bits_like`` an empty integer array of the pattern's width (the
    winner search's scratch type, see ``rows.first_maximum``)."""

    geometry_all: bool
    taxonomy_all: bool
    n_random: int
    want_sink: bool
    want_bounds: bool
    tolerance: float
    bits_like: np.ndarray


class Tallies(NamedTuple):
    """The layer pass' counts and sums: ``bad_rows`` ``[batch, head]`` (real rows that fail a
    check); ``votes`` ``[batch, head, 3]`` and ``offsets`` ``[batch, head, key]`` (added to);
    ``random_sum`` ``[3, batch, head, q, n]`` (P, R, F summed over the random rankings)."""

    bad_rows: np.ndarray
    votes: np.ndarray
    offsets: np.ndarray
    random_sum: np.ndarray


class Certificates(NamedTuple):
    """Theorem 1's lower bounds on P and R ``[batch, head, q, n]``."""

    precision: np.ndarray
    recall: np.ndarray


class LayerOutputs(NamedTuple):
    """Everything the layer pass writes (a parallel loop takes the parts, not this bundle of
    bundles: numba's parallel loops accept no nested tuples)."""

    metrics: Metrics
    checks: RowChecks
    sink: Sink
    certificates: Certificates
    tallies: Tallies


def integer_like(itemsize: int) -> np.ndarray:
    """An empty integer array of ``itemsize`` bytes an entry (float32 → int32, float64 → int64):
    the type of the scratch in which the kernels read non-negative floats as their bit patterns."""
    return np.empty(0, dtype=np.dtype(f"i{itemsize}"))


class SeparabilityRows(NamedTuple):
    """The separability kernel's rows: ``rows`` ``[batch, head, q, key]`` (the chosen queries);
    ``scores`` like ``rows`` (read for ranking 2 only); ``qpos``, ``qvalid`` ``[batch, q]`` the
    queries' positions and whether they are real; ``key_mask`` ``[batch, key]``."""

    rows: np.ndarray
    scores: np.ndarray
    qpos: np.ndarray
    qvalid: np.ndarray
    key_mask: np.ndarray
