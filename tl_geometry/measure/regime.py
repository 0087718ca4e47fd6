"""The sink-aware constant-norm regime (docs/metrics.md#regime): its fit per head.

The paper's theory assumes that non-sink value vectors share a (near-)constant norm ``c`` with
bounded directional coherence, and that the sink has a distinct, smaller norm ``c_0`` and a
signed alignment to the non-sink directions. :func:`fit_regime` measures each of these on real
value vectors, so whether a head is in the regime is part of the output; the statistics it
reads once (:class:`ValueStatistics`) also feed the certificates (:mod:`.certificates`).

Example:
    >>> import torch
    >>> v = torch.eye(4)[None, :, None, :] * torch.tensor([0.5, 2, 2, 2])[None, :, None, None]
    >>> fit_regime(v).c.tolist(), fit_regime(v).coherence_max.tolist()
    ([[2.0]], [[0.0]])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from .. import _engine as engine
from ..backend import on_engine
from ..errors import TLGeometryError
from .sink import value_norms_and_sink_cosines

__all__ = ["RegimeFit", "fit_regime", "regime_envelope", "ValueStatistics", "value_statistics", "fit_from_statistics",
           "envelope_from_statistics", "NORM_TOLERANCE", "SIGN_TOLERANCE"]


NORM_TOLERANCE = 0.1  # relative spread (std / mean) of non-sink norms accepted as "constant"
SIGN_TOLERANCE = 0.9  # share of non-sink sources whose sink cosine has the majority sign


@dataclass
class RegimeFit:
    """How well the value vectors of each (sequence, kv head) fit the regime. All ``[batch, kv_head]``.

    Attributes:
        c: mean non-sink value norm; ``c_spread``: its std / mean (0 = exactly constant norm);
            ``c_min``, ``c_max``: the norm envelope.
        c0: sink value norm ‖v_0‖.
        coherence_max, coherence_mean: max and mean |cos(v_i, v_j)| over non-sink pairs i ≠ j.
        sink_alignment: mean cos(v_0, v_j) over non-sink j; ``alignment_min``/``alignment_max``: its range.
        sign_consistency: share of non-sink j whose cos(v_0, v_j) has the majority sign.
    """

    c: Float[Tensor, "batch kv_head"]
    c_spread: Float[Tensor, "batch kv_head"]
    c_min: Float[Tensor, "batch kv_head"]
    c_max: Float[Tensor, "batch kv_head"]
    c0: Float[Tensor, "batch kv_head"]
    coherence_max: Float[Tensor, "batch kv_head"]
    coherence_mean: Float[Tensor, "batch kv_head"]
    sink_alignment: Float[Tensor, "batch kv_head"]
    alignment_min: Float[Tensor, "batch kv_head"]
    alignment_max: Float[Tensor, "batch kv_head"]
    sign_consistency: Float[Tensor, "batch kv_head"]

    def holds(self, norm_tolerance: float = NORM_TOLERANCE, sign_tolerance: float = SIGN_TOLERANCE
              ) -> Bool[Tensor, "batch kv_head"]:
        """The regime's assumptions within tolerance: near-constant non-sink norm
        (``c_spread ≤ norm_tolerance``), a smaller sink (``c0 < c``) and a signed sink alignment
        (``sign_consistency ≥ sign_tolerance``). Coherence enters the bounds as a parameter and
        is reported, not thresholded."""
        return (self.c_spread <= norm_tolerance) & (self.c0 < self.c) & (self.sign_consistency >= sign_tolerance)


def _unit(values: Tensor) -> Tensor:
    """Unit vectors without the cosine distance's additive 1e-12 guard (docs/metrics.md#separability), which would shrink |cos| below the
    true value and break the envelope (zero vectors stay zero)."""
    return values / values.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(values.dtype).tiny)


def _nonsink_cosines(values: Tensor, nonsink: Tensor, gram: Tensor | None = None,
                     norms: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """|cos| between non-sink pairs ``[batch, kv, key, key]`` (0 off the pairs) and the pair mask;
    from the Gram matrix ``V Vᵀ`` and the norms when the caller has them (one matmul less)."""
    if gram is None:
        unit = _unit(values)
        cos = (unit @ unit.transpose(-1, -2)).abs()
    else:
        tiny = torch.finfo(values.dtype).tiny
        norms = norms.clamp_min(tiny)
        cos = (gram / norms[..., :, None] / norms[..., None, :]).abs()
    n_k = values.shape[2]
    pairs = nonsink[:, None, :, None] & nonsink[:, None, None, :] & ~torch.eye(n_k, dtype=torch.bool, device=values.device)
    return torch.where(pairs, cos, 0.0), pairs


@dataclass
class ValueStatistics:
    """Statistics of one layer's values that the fit, the envelope and the sink diagnostics share
    (computed once). ``norms`` and ``cosines`` (cos(v_0, v_j)) ``[batch, kv, key]``; ``nonsink``
    ``[batch, key]`` (real keys j > 0); over non-sink pairs i ≠ j: ``newest`` ``[batch, kv, key]``
    (``max_{i<t} |cos(v_t, v_i)|``, 0 without such a pair), ``coherence_max`` and ``coherence_mean``
    ``[batch, kv]`` (NaN without pairs)."""

    norms: Float[Tensor, "batch kv key"]
    cosines: Float[Tensor, "batch kv key"]
    nonsink: Bool[Tensor, "batch key"]
    newest: Float[Tensor, "batch kv key"]
    coherence_max: Float[Tensor, "batch kv"]
    coherence_mean: Float[Tensor, "batch kv"]


def value_statistics(values: Float[Tensor, "batch kv key d"], key_mask: Bool[Tensor, "batch key"],
                     gram: Float[Tensor, "batch kv key key"] | None = None) -> ValueStatistics:
    """:class:`ValueStatistics` of ``[batch, kv, key, d]`` values (float32 or wider).

    On the CPU the pair statistics come from the Gram matrix ``V Vᵀ`` (the caller's ``gram``, or
    one per block of sequences) in one numba pass that never holds the ``[key, key]`` cosine
    matrix; elsewhere from that matrix in torch."""
    norms, cosines, nonsink = value_norms_and_sink_cosines(values, key_mask)
    n_nonsink = nonsink.sum(-1, keepdim=True)
    n_pairs = n_nonsink * (n_nonsink - 1)  # ordered pairs i ≠ j, [batch, 1]
    pairs = _pair_statistics_numba(values, norms, nonsink, gram)
    if pairs is None:
        abs_cos, _ = _nonsink_cosines(values, nonsink, gram, norms)
        newest = abs_cos.tril(-1).amax(-1)  # |cos| of (i, j) counts from prefix max(i, j) on
        pairs = newest, abs_cos.amax((-1, -2)), abs_cos.sum((-1, -2))
    newest, largest, total = pairs
    nan = torch.tensor(torch.nan, dtype=norms.dtype, device=norms.device)
    return ValueStatistics(norms, cosines, nonsink, newest, torch.where(n_pairs > 0, largest, nan), total / n_pairs)


def sink_products(values: Tensor) -> Tensor:
    """``⟨v_0, v_j⟩`` in float64 ``[batch, kv, key]``: by the numba kernel on the CPU, else in torch."""
    if on_engine(values):
        return torch.from_numpy(engine.sink_products(values.detach().contiguous().numpy()))
    wide = values.detach().double()
    return (wide * wide[:, :, :1]).sum(-1)


def _pair_statistics_numba(values: Tensor, norms: Tensor, nonsink: Tensor, gram: Tensor | None):
    """(newest, max, sum of |cos| over ordered non-sink pairs) by the numba kernel; None where it
    does not apply (not a CPU tensor)."""
    if not on_engine(values):
        return None
    from .separability_job import block_grams

    batch, n_kv, n_k, _ = values.shape
    newest = torch.zeros(batch, n_kv, n_k, dtype=values.dtype)
    largest = torch.zeros(batch, n_kv, dtype=values.dtype)
    total = torch.zeros(batch, n_kv, dtype=torch.float64)
    norms, nonsink = norms.contiguous(), nonsink.contiguous()
    for b_sl, kv_sl, _, block_gram in block_grams(values, whole=gram):
        engine.pair_cosine_statistics(block_gram.contiguous().numpy(), norms[b_sl, kv_sl].numpy(), nonsink[b_sl].numpy(),
                                      newest[b_sl, kv_sl].numpy(), largest[b_sl, kv_sl].numpy(), total[b_sl, kv_sl].numpy())
    return newest, largest, total.to(values.dtype)


def fit_regime(
    v: Float[Tensor, "batch key kv_head d_head"], *, key_mask: Bool[Tensor, "batch key"] | None = None
) -> RegimeFit:
    """Fit the sink-aware constant-norm regime to the value vectors of each sequence and kv head.

    Args:
        v: ``[batch, key, kv_head, d_head]`` value vectors; position 0 is the sink.
        key_mask: ``[batch, key]`` True for real tokens.

    Returns:
        :class:`RegimeFit`, every field ``[batch, kv_head]`` (NaN where a sequence has no non-sink key).
    """
    if not isinstance(v, Tensor) or v.ndim != 4:
        raise TLGeometryError(f"v must be a tensor [batch, key, kv_head, d_head]; got shape {tuple(getattr(v, 'shape', ()))}.")
    batch, n_k = v.shape[:2]
    values = v.to(torch.promote_types(v.dtype, torch.float32)).permute(0, 2, 1, 3)
    key_mask = torch.ones(batch, n_k, dtype=torch.bool, device=v.device) if key_mask is None else key_mask.bool()
    return fit_from_statistics(value_statistics(values, key_mask))


def fit_from_statistics(stats: ValueStatistics) -> RegimeFit:
    """:func:`fit_regime` from precomputed :class:`ValueStatistics`."""
    norms, cosines, nonsink = stats.norms, stats.cosines, stats.nonsink
    nan = torch.tensor(torch.nan, dtype=norms.dtype, device=norms.device)
    mask = nonsink[:, None, :]
    c = torch.where(mask, norms, nan).nanmean(-1)
    spread = (torch.where(mask, (norms - c[..., None]) ** 2, nan).nanmean(-1)).sqrt() / c
    align = torch.where(mask, cosines, nan)
    positive = (align > 0).sum(-1) / mask.sum(-1)
    return RegimeFit(
        c=c, c_spread=spread,
        c_min=torch.where(mask, norms, torch.inf).amin(-1), c_max=torch.where(mask, norms, -torch.inf).amax(-1),
        c0=norms[..., 0],
        coherence_max=stats.coherence_max,
        coherence_mean=stats.coherence_mean,
        sink_alignment=align.nanmean(-1),
        alignment_min=torch.where(mask, cosines, torch.inf).amin(-1),
        alignment_max=torch.where(mask, cosines, -torch.inf).amax(-1),
        sign_consistency=torch.maximum(positive, 1 - positive),
    )


def regime_envelope(
    values: Float[Tensor, "batch kv key d"], key_mask: Bool[Tensor, "batch key"]
) -> dict[str, Float[Tensor, "batch kv key"]]:
    """Tightest regime parameters of every prefix ``0..t`` (the visible sources of query t).

    Returns ``c_lo, c_hi`` (non-sink norm range), ``mu`` (max |cos| over non-sink pairs),
    ``beta_lo, beta_hi`` (range of cos(v_0, v_j)) and ``c0``, each ``[batch, kv, t]``. A prefix
    without non-sink sources (or pairs) has empty ranges (±inf) and ``mu = 0``.
    """
    return envelope_from_statistics(value_statistics(values, key_mask))


def envelope_from_statistics(stats: ValueStatistics) -> dict[str, Float[Tensor, "batch kv key"]]:
    """:func:`regime_envelope` from precomputed :class:`ValueStatistics`."""
    norms, cosines, nonsink = stats.norms, stats.cosines, stats.nonsink
    mask = nonsink[:, None, :]
    # |cos| of pair (i, j) counts from prefix max(i, j) on: a running max of the newest pairs.
    newest = stats.newest
    return {
        "c_lo": torch.where(mask, norms, torch.inf).cummin(-1).values,
        "c_hi": torch.where(mask, norms, -torch.inf).cummax(-1).values,
        "mu": newest.cummax(-1).values,
        "beta_lo": torch.where(mask, cosines, torch.inf).cummin(-1).values,
        "beta_hi": torch.where(mask, cosines, -torch.inf).cummax(-1).values,
        "c0": norms[..., :1].expand_as(norms),
    }




