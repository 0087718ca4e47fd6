"""The rules every implementation shares, so that all of them select and count alike.

Which sources a query sees (:func:`visible_sources`: its causal prefix less padding, within
the layer's sliding window where it has one), which of them a ranking selects
(:func:`selection_scores`, :func:`top_order`, the float64
value norms of the contribution ranking, :func:`value_norms64`), and the exactly rounded
precision quotient. The public metrics, both separability backends, the compiled layer pass,
the certificates and the sink diagnostics use these and nothing else, so that a certificate
always speaks of the set that was measured.
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from .. import _engine as engine
from ..backend import on_engine
from ..config import Ranking
from ..errors import TLGeometryError

__all__ = ["check_window", "first_visible", "visible_sources", "top_order", "squared_value_norms", "value_norms64",
           "score_dtype", "prepare_scores", "selection_scores", "precision_from_outside", "COS_EPS"]

# Added to cosine denominators: a zero vector has cosine 0 with everything (the engine's constant).
COS_EPS = engine.COS_EPS


def check_window(window: int | None) -> int | None:
    """A sliding window as given (``None``: every query sees its whole causal prefix), refused
    unless it is an int ≥ 1."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise TLGeometryError(f"window must be None (no sliding window) or an int ≥ 1 (query t sees keys "
                              f"t − window + 1 .. t); got {window!r}.")
    return window


def first_visible(qpos: Int[Tensor, "*batch q"], window: int | None) -> Int[Tensor, "*batch q"]:
    """The first key each query sees: ``max(0, t − window + 1)`` in a sliding-window layer, else 0.

    >>> first_visible(torch.tensor([0, 3, 9]), 4).tolist()
    [0, 0, 6]
    """
    return torch.zeros_like(qpos) if window is None else (qpos - window + 1).clamp_min(0)


def visible_sources(key_mask: Bool[Tensor, "batch key"], qpos: Int[Tensor, "batch q"],
                    window: int | None) -> Bool[Tensor, "batch q key"]:
    """The sources each query sees: real keys ``first_visible(t) .. t``. The one definition of a
    row's candidates (the engine's ``rows.first_visible`` is its compiled twin); position 0 is a
    row's sink only where it is visible.

    >>> visible_sources(torch.ones(1, 4, dtype=torch.bool), torch.tensor([[3]]), 2).int().tolist()
    [[[0, 0, 1, 1]]]
    """
    positions = torch.arange(key_mask.shape[-1], device=key_mask.device)
    qpos = qpos.to(key_mask.device)[..., None]
    return (positions <= qpos) & (positions >= first_visible(qpos, window)) & key_mask[:, None, :]


def top_order(score: Float[Tensor, "... key"], m: int) -> Int[Tensor, "... m"]:
    """Indices of the ``m`` highest scores per row, best first, ties to the lower position.

    Equals ``torch.sort(score, descending=True, stable=True).indices[..., :m]``. For float32
    rows shorter than 2^16 it runs ``topk`` on unique int64 keys (order-preserving float bits,
    then the reversed position), about twice as fast as a stable full sort.

    >>> top_order(torch.tensor([0.2, 0.5, 0.2, 0.1]), 3).tolist()
    [1, 0, 2]
    """
    n_k = score.shape[-1]
    if score.dtype != torch.float32 or n_k >= 1 << 16:
        return torch.sort(score, dim=-1, descending=True, stable=True).indices[..., :m]
    bits = (score + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into 0.0 (they tie as floats)
    bits = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: reverse their bit order
    position = torch.arange(n_k - 1, -1, -1, device=score.device)  # earlier position, larger key
    keys = (bits.long() << 16) | position
    return keys.topk(m, dim=-1, sorted=True).indices


def squared_value_norms(values: Float[Tensor, "batch kv key d"]) -> Float[Tensor, "batch kv key"]:
    """``‖v‖²`` in float64: the one computation behind every contribution ranking (``α‖v‖``), so
    separability (either backend), the bounds and the sink diagnostics select the same sets."""
    if on_engine(values):
        return torch.from_numpy(engine.squared_norms(values.detach().contiguous().numpy()))
    return values.detach().double().pow(2).sum(-1)


def value_norms64(values: Float[Tensor, "batch kv key d"],
                  squares: Float[Tensor, "batch kv key"] | None = None) -> Float[Tensor, "batch kv key"]:
    """``‖v‖ = sqrt(‖v‖²)`` in float64, computed once per layer and handed to every consumer of
    the contribution ranking ``α‖v‖`` (both separability backends, the compiled layer pass, the
    bounds and the sink diagnostics). One correctly rounded square root on the CPU (the kernels'
    own); elsewhere torch's. Two square roots that differ in the last ulp would select different
    sets at near-ties, and a certificate would speak of a set that was not measured. ``squares``:
    the caller's :func:`squared_value_norms` of ``values``, when it has them."""
    squares = squared_value_norms(values) if squares is None else squares
    if on_engine(squares):
        return torch.from_numpy(engine.norms_from_squares(squares.numpy()))
    return squares.sqrt()


def score_dtype(scores: torch.dtype, working: torch.dtype) -> torch.dtype:
    """The dtype a caller's score tensor is ranked in, on every route: float32 where the scores
    are floats float32 holds exactly (float32, float16, bfloat16) and the measurement runs in
    float32, else float64 (integers above 2²⁴ or float64 scores keep their order there)."""
    exact_in_float32 = scores in (torch.float32, torch.float16, torch.bfloat16)
    return torch.float32 if exact_in_float32 and working == torch.float32 else torch.float64


def prepare_scores(scores: Tensor, working: torch.dtype) -> Tensor:
    """A caller's ranking scores as every route ranks them (the one conversion: the separability
    job, its numba kernel, the layer pass and the certificates read its result): NaN refused, cast
    to :func:`score_dtype`, ``-inf`` clamped to that dtype's lowest finite value (a candidate scored
    ``-inf`` still comes before every non-candidate, and two of them tie).

    >>> prepare_scores(torch.tensor([-torch.inf, -torch.inf, torch.finfo(torch.float32).min]), torch.float32).tolist()
    [-3.4028234663852886e+38, -3.4028234663852886e+38, -3.4028234663852886e+38]
    """
    if scores.is_floating_point() and bool(torch.isnan(scores).any()):
        raise TLGeometryError("ranking scores contain NaN: give every source a comparable score.")
    dtype = score_dtype(scores.dtype, working)
    return scores.to(dtype).clamp_min(torch.finfo(dtype).min)


def selection_scores(
    alpha: Float[Tensor, "batch head q key"],
    candidates: Bool[Tensor, "... key"],
    ranking: Ranking | Tensor,
    value_norm: Float[Tensor, "batch kv key"] | None,
    group: int,
) -> Float[Tensor, "batch head q key"]:
    """Scores that decide every top-N set (the numba kernels apply the same rule): ``α``,
    ``α·‖v‖`` in float64 with ``‖v‖`` from :func:`value_norms64`, or the caller's scores, converted
    once by the caller (:func:`prepare_scores`: the separability job, ``QueryRows``); candidates'
    scores clamped to finite values and non-candidates at ``-inf``, so a candidate scored ``-inf``
    still comes before every non-candidate. Ties are broken by :func:`top_order`."""
    if isinstance(ranking, Tensor):
        score = ranking
    elif ranking == "contribution":
        score = alpha.double() * value_norm.repeat_interleave(group, 1)[:, :, None, :]
    elif ranking == "attention":
        score = alpha
    else:
        raise TLGeometryError(f"ranking must be 'attention', 'contribution' or a score tensor; got {ranking!r}.")
    return torch.where(candidates, score.clamp_min(torch.finfo(score.dtype).min), -torch.inf)


def precision_from_outside(n_value: int, outside: Tensor) -> Tensor:
    """``N / (N + outside)`` correctly rounded (``n / tensor`` would multiply by a reciprocal), so
    every implementation and bound gives the same float for the same counts."""
    denominator = n_value + outside
    return torch.full_like(denominator, n_value) / denominator
