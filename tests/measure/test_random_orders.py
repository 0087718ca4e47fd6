"""The torch random rankings draw exactly the engine's stream, and that stream is uniform."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tl_geometry import _engine as engine
from tl_geometry.measure.random_orders import random_top_orders


@pytest.mark.parametrize("window", [None, 1, 5])
@pytest.mark.parametrize("exclude_sink", [False, True])
def test_torch_draws_equal_the_engines(exclude_sink, window):
    g = torch.Generator().manual_seed(1)
    for _ in range(12):
        batch, heads, n_k = 3, 4, int(torch.randint(2, 40, (1,), generator=g))
        key_mask = torch.rand(batch, n_k, generator=g) > 0.3
        qpos = torch.randint(0, n_k, (batch, 5), generator=g)
        qvalid = torch.rand(batch, 5, generator=g) > 0.2
        keys = torch.randint(-2**62, 2**62, (batch,), generator=g) * 2 + 1  # every bit pattern, the sign too
        repeats, max_n = 3, int(torch.randint(1, 12, (1,), generator=g))
        expected = torch.full((repeats, batch, heads, 5, max_n), -1, dtype=torch.int64)
        engine.random_top_orders(keys.numpy().view(np.uint64), key_mask.numpy(), qpos.numpy(), qvalid.numpy(),
                                 exclude_sink, window or 0, expected.numpy())
        got = random_top_orders(keys, key_mask, qpos, qvalid, heads, repeats, max_n, exclude_sink, window)
        assert torch.equal(got, expected)
        if window is not None:  # every draw is a visible source
            drawn = got >= 0
            t = qpos[None, :, None, :, None].expand_as(got)
            assert bool(((got > t - window) & (got <= t))[drawn].all())


def test_a_first_draw_is_uniform_over_the_candidates():
    n_k, repeats = 5, 4000
    orders = random_top_orders(torch.arange(repeats), torch.ones(repeats, n_k, dtype=torch.bool),
                               torch.full((repeats, 1), n_k - 1), torch.ones(repeats, 1, dtype=torch.bool), 1, 1, 2,
                               False)
    counts = torch.bincount(orders[0, :, 0, 0, 0], minlength=n_k).double()
    expected = repeats / n_k
    assert float(((counts - expected) ** 2 / expected).sum()) < 18.5  # χ², 4 degrees of freedom, p = 0.001
    assert bool((orders[..., 0] != orders[..., 1]).all())  # a sample without replacement
