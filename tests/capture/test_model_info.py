"""What a model is (capture/model_info.py): its class by duck typing, its processing, its sliding windows, its context."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tl_geometry.capture.adapters import stream_layers, unexplained_window
from tl_geometry.capture.model_info import _sliding_windows, describe_model
from tl_geometry.errors import TLGeometryError

from ..tiny import random_tokens, tiny_bridge, tiny_hooked


def test_describe_model_both_classes(tiny_model):
    info = describe_model(tiny_model)
    assert info.model_class in ("HookedTransformer", "TransformerBridge")
    assert (info.n_layers, info.n_heads, info.d_head) == (3, 4, 8)
    assert info.n_heads % info.n_kv_heads == 0
    assert info.processing["value_bias_folded"] is False


def test_model_class_detected_by_instance():
    assert describe_model(tiny_bridge()).model_class == "TransformerBridge"


def test_hooked_model_class_detected():
    assert describe_model(tiny_hooked()).model_class == "HookedTransformer"


def test_not_a_model_raises_type_error_naming_what_is_missing():
    with pytest.raises(TLGeometryError, match="lacks cfg, run_with_hooks, hook_dict, blocks"):
        describe_model(torch.nn.Linear(2, 2))


def test_non_causal_model_refused():
    model = tiny_bridge()
    model.cfg.attention_dir = "bidirectional"
    with pytest.raises(ValueError, match="causal"):
        stream_layers(model, random_tokens(1, 5), lambda *a: None)


def test_value_bias_folding_is_recorded_and_warned():
    model = tiny_hooked()
    model.cfg.original_architecture = "GPT2LMHeadModel"  # has value biases; b_V here is all zero
    with pytest.warns(UserWarning, match="fold_value_biases"):
        info = describe_model(model)
    assert info.processing["value_bias_folded"] is True


def test_sliding_window_layers_read_from_the_hooked_config():
    model = tiny_hooked(use_local_attn=True, attn_types=["global", "local", "global"], window_size=4)
    assert describe_model(model).sliding_windows == {1: 4}
    seen = {}
    stream_layers(model, random_tokens(1, 8), lambda layer, att: seen.setdefault(layer, att))
    # what the adapters read is what the model does: the local layer's last query sees 4 keys
    assert (seen[0].window, seen[1].window) == (None, 4)
    assert int((seen[1].pattern[0, :, -1] > 0).sum(-1).max()) == 4
    assert int((seen[0].pattern[0, :, -1] > 0).sum(-1).min()) == 8
    assert all(unexplained_window(att) is None for att in seen.values())


@pytest.mark.parametrize("hf_config, expected", [
    ({"sliding_window": 512, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]},
     {0: 512, 2: 512}),
    ({"sliding_window": 4096}, {0: 4096, 1: 4096, 2: 4096}),  # Mistral: every layer
    ({"sliding_window": 4096, "use_sliding_window": False}, {}),  # Qwen2 with the window switched off
    ({"sliding_window": None}, {}),
    ({"text_config": SimpleNamespace(sliding_window=8, layer_types=["full_attention"] * 2 + ["sliding_attention"])},
     {2: 8}),
    # Qwen2 before layer_types: the layers from max_window_layers on slide
    ({"sliding_window": 32, "use_sliding_window": True, "max_window_layers": 1}, {1: 32, 2: 32}),
    ({"sliding_window": 32, "use_sliding_window": False, "max_window_layers": 1}, {}),
    # GPT-Neo: window_size on its "local" attention_layers
    ({"window_size": 256, "attention_layers": ["global", "local", "global"]}, {1: 256}),
])
def test_sliding_window_layers_read_from_a_bridged_hugging_face_config(hf_config, expected):
    model = SimpleNamespace(cfg=SimpleNamespace(), original_model=SimpleNamespace(config=SimpleNamespace(**hf_config)))
    assert _sliding_windows(model, 3) == expected
