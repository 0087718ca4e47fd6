"""Random attention inputs shared by the metric tests."""

from __future__ import annotations

import torch


def random_attention(batch, heads, kv, pos, d=4, seed=0, lengths=None, dtype=torch.float64, peaked=1.0, window=None):
    """Causal softmax rows and Gaussian values; pads (beyond `lengths`) masked out of the rows, and
    with a sliding `window` the keys before t − window + 1 (as a sliding-window layer masks them)."""
    g = torch.Generator().manual_seed(seed)
    lengths = lengths or [pos] * batch
    key_mask = torch.arange(pos)[None, :] < torch.tensor(lengths)[:, None]
    scores = torch.randn(batch, heads, pos, pos, generator=g, dtype=dtype) * peaked
    causal = torch.ones(pos, pos, dtype=torch.bool).tril()
    if window is not None:
        causal &= ~torch.ones(pos, pos, dtype=torch.bool).tril(-window)
    allowed = causal[None, None] & key_mask[:, None, None, :]
    pattern = scores.masked_fill(~allowed, -torch.inf).softmax(-1).nan_to_num(0.0)
    v = torch.randn(batch, pos, kv, d, generator=g, dtype=dtype) * (1 + torch.rand(batch, pos, kv, 1, generator=g, dtype=dtype))
    return pattern, v, key_mask


# tiny runs rest their labels on few votes: tests that expect no other warning filter this one
FEW_VOTES_WARNING = "the regime labels rest on"


def softmax_rows(dtype, batch=2, heads=2, pos=48, seed=0):
    """Causal softmax rows computed in ``dtype`` (as a model running in it writes hook_pattern)."""
    gen = torch.Generator().manual_seed(seed)
    scores = (3 * torch.randn(batch, heads, pos, pos, generator=gen)).to(dtype)
    causal = torch.ones(pos, pos, dtype=torch.bool).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1)


def regime_inputs(seed, pos, d, heads, c, c0, beta, temperature, sink_bias, shared=0.3):
    """Values in the regime exactly: non-sink norm c around a shared direction e (weight
    `shared`, which sets the coherence), a sink of norm c0 < c with cos(v_0, e) = beta (the signed
    alignment); causal attention rows of any sharpness, with extra logit `sink_bias` on the sink."""
    g = torch.Generator().manual_seed(seed)

    def unit(x):
        return x / x.norm(dim=-1, keepdim=True)

    noise = unit(torch.randn(1, pos, 1, d, generator=g, dtype=torch.float64))
    e = unit(torch.randn(d, generator=g, dtype=torch.float64))
    noise = unit(noise - (noise @ e)[..., None] * e)  # orthogonal to e
    units = unit(shared * e + (1 - shared**2) ** 0.5 * noise)
    sink = unit(beta * e + (1 - beta**2) ** 0.5 * noise[:, :1])
    v = torch.cat([c0 * sink, c * units[:, 1:]], 1)
    logits = torch.randn(1, heads, pos, pos, generator=g, dtype=torch.float64) * temperature
    logits[..., 0] += sink_bias
    causal = torch.ones(pos, pos, dtype=torch.bool).tril()
    return logits.masked_fill(~causal, -torch.inf).softmax(-1), v
