"""Reading a cache (capture/cache.py): a layer of an ActivationCache or a plain dict equals the streamed forward's."""

from __future__ import annotations

import torch

from tl_geometry.capture.adapters import hook_names, stream_layers
from tl_geometry.capture.cache import read_layer

from ..tiny import random_tokens


def _collect(model, tokens, **kwargs):
    out = {}
    stream_layers(model, tokens, lambda layer, att: out.__setitem__(layer, att), **kwargs)
    return out


def test_streaming_equals_cache_path(tiny_model):
    tokens = random_tokens(2, 8, seed=1)
    streamed = _collect(tiny_model, tokens)
    _, cache = tiny_model.run_with_cache(tokens)
    assert sorted(streamed) == list(range(tiny_model.cfg.n_layers))
    for layer, att in streamed.items():
        ref = read_layer(cache, layer)
        torch.testing.assert_close(att.pattern, ref.pattern)
        torch.testing.assert_close(att.v, ref.v)
        assert att.pattern.dtype == torch.float32 and att.v.shape[2] == att.pattern.shape[1]


def test_read_layer_from_plain_dict_and_left_padding_realigned():
    pattern = torch.zeros(1, 2, 4, 4)
    pattern[0, :, 1, 1] = 1.0  # left pad at position 0; first real query attends to itself
    pattern[0, :, 2, 1:3] = 0.5
    pattern[0, :, 3, 1:4] = 1 / 3
    v = torch.arange(4.0).view(1, 4, 1, 1).expand(1, 4, 1, 3)
    names = hook_names(0)
    att = read_layer({names[0]: pattern, names[1]: v}, 0, attention_mask=torch.tensor([[0, 1, 1, 1]]))
    assert att.key_mask.tolist() == [[True, True, True, False]]
    assert att.pattern[0, 0, 0, 0] == 1.0 and att.pattern[0, 0, 1, :2].tolist() == [0.5, 0.5]
    assert att.v[0, :3, 0, 0].tolist() == [1.0, 2.0, 3.0] and att.v.shape == (1, 4, 2, 3)
