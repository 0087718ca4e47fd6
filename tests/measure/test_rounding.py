"""The rounding model (measure/rounding.py): γ_m and its counts, where the model breaks, the
slacks set to +inf there, the per-row counts, and flush-to-zero refused."""

from __future__ import annotations

import math

import pytest
import torch

from tl_geometry.errors import TLGeometryError
from tl_geometry.measure.rounding import (
    SLACK_KEYS,
    check_gradual_underflow,
    fail_closed,
    gamma,
    gammas,
    prefix_counts,
    rounding_model_holds,
    slack_count,
)


@pytest.mark.parametrize("u", [2.0**-8, 2.0**-11, 2.0**-24])
def test_gamma_is_infinite_exactly_where_m_u_reaches_1(u):
    m = int(1 / u)
    assert math.isfinite(gamma(m - 1, u)) and gamma(m, u) == math.inf
    assert gamma(m - 1, u) == (m - 1) * u / (1 - (m - 1) * u)
    assert torch.equal(gammas(torch.tensor([m - 1.0, float(m)], dtype=torch.float64), u),
                       torch.tensor([gamma(m - 1, u), math.inf], dtype=torch.float64))


def test_the_model_holds_below_the_largest_count():
    # bfloat16 products (u = 2⁻⁸): m = 2(n + d) + 16 < 256, i.e. n + d < 120
    assert slack_count(4, 115) == 254 and rounding_model_holds(4, 115, 2.0**-8)
    assert not rounding_model_holds(4, 116, 2.0**-8)
    assert rounding_model_holds(4, 1011, 2.0**-11) and not rounding_model_holds(4, 1012, 2.0**-11)
    # a row's count is its own keys': prefix t has t + 1 of them
    assert prefix_counts(3, 8, torch.device("cpu")).tolist() == [slack_count(n, 8) for n in (1, 2, 3)]


def test_where_the_model_breaks_every_slack_is_infinite_and_nothing_else_changes():
    table = {key: torch.ones(1, 1, 3, dtype=torch.float64) for key in ("diag_lo", *SLACK_KEYS)}
    out = fail_closed(table, torch.tensor([255.0, 256.0, 100.0], dtype=torch.float64), 2.0**-8)  # m·u < 1, = 1, < 1
    assert torch.equal(out["diag_lo"], table["diag_lo"])
    for key in SLACK_KEYS:
        assert out[key].flatten().tolist() == [1.0, math.inf, 1.0]


def test_flush_to_zero_is_refused_on_the_cpu():
    values = torch.ones(1, 1, 2, 2)
    check_gradual_underflow(values)
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush subnormals")
    try:
        with pytest.raises(TLGeometryError, match="flush-to-zero is on"):
            check_gradual_underflow(values)
    finally:
        torch.set_flush_denormal(False)
    check_gradual_underflow(values)
