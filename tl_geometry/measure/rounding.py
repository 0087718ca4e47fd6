"""The rounding model the certificates rest on (docs/theory.md, Lemma 3 and "Where the rounding
model breaks"): the unit roundoff of a measurement, torch's reduced-precision matrix products
included; the counts ``γ_m`` and ``m`` of the slacks; the underflow slack; and where the model
breaks, the tables' slacks set to +inf (``m·u ≥ 1``) or certification refused (flush-to-zero)."""

from __future__ import annotations

import math

import torch
from jaxtyping import Float
from torch import Tensor

from .. import _engine as engine
from ..errors import TLGeometryError

__all__ = ["unit_roundoff", "rounding_model_holds", "check_gradual_underflow", "gamma", "gammas", "slack_count",
           "prefix_counts", "fail_closed", "underflow_unit", "underflow_slack", "SLACK_KEYS"]

# The rows a route must find finite before it certifies anything (fail closed otherwise).
SLACK_KEYS = ("slack_w", "slack_64", "gram_err", "slack_abs")

# The unit roundoff of a float32 matrix product at each reduced precision torch offers.
_REDUCED = {"medium": 2.0**-8, "bf16": 2.0**-8, "high": 2.0**-11, "tf32": 2.0**-11}


def _matmul_precisions(device_type: str) -> list[str]:
    """Every float32 matmul precision setting that can apply on ``device_type``: the legacy global
    one (which newer torch refuses to read once a per-backend one is set) and the per-backend
    ``fp32_precision`` chain of newer torch (``"none"`` inherits from the level above)."""
    found = []
    try:
        found.append(torch.get_float32_matmul_precision())
    except RuntimeError:  # legacy and per-backend settings mixed: the per-backend ones below decide
        pass
    backend = torch.backends.cuda if device_type == "cuda" else getattr(torch.backends, "mkldnn", None)
    chain = [getattr(getattr(backend, "matmul", None), "fp32_precision", None),
             getattr(backend, "fp32_precision", None), getattr(torch.backends, "fp32_precision", None)]
    found.append(next((p for p in chain if isinstance(p, str) and p != "none"), "ieee"))
    return found


def unit_roundoff(dtype: torch.dtype, device: torch.device | str = "cpu") -> float:
    """The unit roundoff ``u`` of a ``dtype`` measurement: ``eps / 2``, or that of the reduced
    precision torch may use for float32 matrix products (``torch.set_float32_matmul_precision``
    ``"high"`` or a backend's ``fp32_precision = "tf32"``: ``2⁻¹¹``; ``"medium"`` or ``"bf16"``:
    ``2⁻⁸``; on CUDA also ``torch.backends.cuda.matmul.allow_tf32``). The certificates' slacks scale
    with it, so a reduced-precision run keeps valid (weaker, or trivial) certificates
    (docs/theory.md, Lemma 3)."""
    u = torch.finfo(dtype).eps / 2
    if dtype != torch.float32:
        return u
    device_type = torch.device(device).type
    for precision in _matmul_precisions(device_type):
        u = max(u, _REDUCED.get(precision, u))
    if device_type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        u = max(u, 2.0**-11)
    return u


def gamma(m: int, u: float) -> float:
    """``γ_m = m·u / (1 − m·u)`` (inf when ``m·u ≥ 1``: nothing can be certified)."""
    return m * u / (1 - m * u) if m * u < 1 else math.inf


def rounding_model_holds(n_keys: int, d_head: int, roundoff: float) -> bool:
    """Whether Lemma 3's rounding model bounds a measurement of ``n_keys`` keys, head dimension
    ``d_head`` and unit roundoff ``roundoff``: every ``γ`` the slacks use is finite, i.e.
    ``m·u < 1`` with ``m = 2(n + d) + 16`` (the largest count; ``d + 2``, ``d + 4`` and ``2d + 8``
    are smaller). Where it fails, every slack of the table is +inf and the certificates are the
    trivial bound (docs/theory.md, "Where the rounding model breaks")."""
    return math.isfinite(gamma(slack_count(n_keys, d_head), roundoff))


def slack_count(n_keys: int, d_head: int) -> int:
    """``m = 2(n + d) + 16``: the largest rounding count of Lemma 3 for a row of ``n`` keys."""
    return 2 * (n_keys + d_head) + 16


def prefix_counts(n_keys: int, d_head: int, device: torch.device) -> Float[Tensor, " key"]:
    """``m`` of each prefix ``0..t``: a row of query ``t`` has ``t + 1`` keys whatever the batch's
    padded length, so its slacks do not depend on its padding or batch companions."""
    return 2 * (torch.arange(1, n_keys + 1, dtype=torch.float64, device=device) + d_head) + 16


def gammas(m: Tensor, u: float) -> Tensor:
    """:func:`gamma` of every count of ``m`` (inf where ``m·u ≥ 1``)."""
    mu = m * u
    return torch.where(mu < 1, mu / (1 - mu), torch.inf)


def fail_closed(table: dict[str, Tensor], m: Tensor, u: float) -> dict[str, Tensor]:
    """``table`` where the rounding model holds (``m·u < 1`` per prefix, as in
    :func:`rounding_model_holds`); elsewhere every slack +inf, which every certificate route reads as
    "nothing certified" (the trivial bound)."""
    holds = m * u < 1
    return {k: torch.where(holds, x, torch.inf) if k in SLACK_KEYS else x for k, x in table.items()}


def underflow_unit(dtype: torch.dtype, roundoff: float) -> float:
    """``η = 2u·tiny``: a bound on the absolute error of a working-``dtype`` operation whose result
    is subnormal (the subnormal spacing of the format that rounds, reduced-precision included)."""
    return torch.finfo(dtype).tiny * (2 * roundoff)


def underflow_slack(scale: Tensor, dtype: torch.dtype, roundoff: float, m: Tensor, d_head: int) -> Tensor:
    """The absolute slack of gradual underflow (docs/theory.md, Lemma 3 step 4), per prefix of
    largest ``‖v‖² = M``: with ``η = 2u·tiny`` of the working ``dtype`` (the subnormal spacing, twice
    the largest underflow error: ``u·tiny`` itself is no float64), ``4m·η·(M + d)`` for the
    measurement's and the certificate's arithmetic and ``20(√(d·η·M) + d·η)`` for the computed
    cosines. Negligible beside every margin in the normal range; decisive where values are tiny."""
    eta = underflow_unit(dtype, roundoff)
    return 4 * m * eta * (scale + d_head) + 20 * (math.sqrt(d_head * eta) * scale.sqrt() + d_head * eta)


def check_gradual_underflow(values: Tensor) -> None:
    """Refuse to certify on the CPU where a thread flushes subnormal numbers to zero: Lemma 3's
    underflow slack assumes gradual underflow (duplicates of norm 10⁻¹⁹ would read as orthogonal)."""
    if values.device.type == "cpu" and engine.flushes_subnormals():
        raise TLGeometryError(
            "the certificates assume gradual underflow, but flush-to-zero is on (torch.set_flush_denormal(True), "
            "or a library built with fast-math): call torch.set_flush_denormal(False) first, or measure without "
            "certificates (sink=False).")
