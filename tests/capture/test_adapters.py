"""Hook-point adapters: both model classes, GQA alignment, padding, streaming vs cache, errors."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import tl_geometry as tlg
from tl_geometry.capture.adapters import align_value_heads, hook_names, stream_layers, unexplained_window
from tl_geometry.capture.cache import read_layer
from tl_geometry.errors import TLGeometryError
from tl_geometry.intervene.ablation import mean_nll
from tl_geometry.run.analysis import analyze

from ..tiny import random_tokens, tiny_bridge, tiny_windowed


def _collect(model, tokens, **kwargs):
    out = {}
    stream_layers(model, tokens, lambda layer, att: out.__setitem__(layer, att), **kwargs)
    return out


def test_gqa_alignment_reproduces_hook_z(tiny_model):
    """hook_z == pattern @ v_aligned for every query head: the kv head mapping is the model's own."""
    tokens = random_tokens(2, 9)
    _, cache = tiny_model.run_with_cache(tokens)
    for layer in range(tiny_model.cfg.n_layers):
        att = read_layer(cache, layer)
        z = torch.einsum("bhqk,bkhd->bqhd", att.pattern, att.v)
        torch.testing.assert_close(z, cache[f"blocks.{layer}.attn.hook_z"].float(), atol=1e-5, rtol=1e-5)


def test_align_value_heads_is_repeat_interleave_not_repeat():
    v = torch.arange(3.0).view(1, 1, 3, 1)
    assert align_value_heads(v, 6).flatten().tolist() == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="does not divide"):
        align_value_heads(v, 4)


def test_streaming_a_subset_of_layers(tiny_model):
    streamed = _collect(tiny_model, random_tokens(1, 6), layers=[1])
    assert list(streamed) == [1]


@pytest.mark.parametrize("layers", [None, [0]])
def test_the_forward_stops_once_the_last_layer_is_measured_and_leaves_no_hook(tiny_model, layers):
    """Nothing after the last chosen layer runs (the next layer, or the unembedding), and stopping
    there leaves every hook point as it was."""
    after = "ln_final.hook_normalized" if layers is None else "blocks.1.hook_resid_pre"
    ran = []
    tiny_model.hook_dict[after].add_hook(lambda tensor, hook: ran.append(hook.name), is_permanent=True)
    hooks = lambda: {name: len(point.fwd_hooks) for name, point in tiny_model.hook_dict.items()}  # noqa: E731
    try:
        before = hooks()
        streamed = _collect(tiny_model, random_tokens(2, 6), layers=layers)
        assert sorted(streamed) == (layers or list(range(tiny_model.cfg.n_layers))) and not ran
        assert hooks() == before
        tiny_model(random_tokens(1, 6))
        assert len(ran) == 1  # the model itself still runs to the end
    finally:
        tiny_model.reset_hooks(including_permanent=True)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_equals_unpadded(tiny_model, side):
    long, short = random_tokens(1, 9, seed=2), random_tokens(1, 5, seed=3)
    pad = torch.zeros(1, 4, dtype=torch.long)
    row = torch.cat([pad, short], 1) if side == "left" else torch.cat([short, pad], 1)
    mask = torch.ones(2, 9, dtype=torch.long)
    if side == "left":
        mask[1, :4] = 0
    else:
        mask[1, 5:] = 0
    batched = _collect(tiny_model, torch.cat([long, row]), attention_mask=mask)
    alone_long, alone_short = _collect(tiny_model, long), _collect(tiny_model, short)
    for layer, att in batched.items():
        assert att.key_mask[1].tolist() == [True] * 5 + [False] * 4
        assert torch.equal(att.query_mask, att.key_mask)
        torch.testing.assert_close(att.pattern[0], alone_long[layer].pattern[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(att.v[0], alone_long[layer].v[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(att.pattern[1, :, :5, :5], alone_short[layer].pattern[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(att.v[1, :5], alone_short[layer].v[0], atol=1e-5, rtol=1e-4)


def test_has_bos_flags():
    pattern, v = torch.full((2, 1, 3, 3), 1 / 3), torch.ones(2, 3, 1, 2)
    names = hook_names(0)
    tokens = torch.tensor([[7, 5, 5], [5, 5, 5]])
    att = read_layer({names[0]: pattern, names[1]: v}, 0, tokens=tokens, bos_token_id=7)
    assert att.has_bos.tolist() == [True, False]


@pytest.mark.ill_typed
def test_bad_inputs_raise_clear_errors():
    names = hook_names(0)
    good_pattern, good_v = torch.full((1, 4, 3, 3), 1 / 3), torch.ones(1, 3, 2, 8)
    with pytest.raises(ValueError, match="hook_v"):
        read_layer({names[0]: good_pattern}, 0)
    with pytest.raises(ValueError, match="blocks.5.attn.hook_pattern"):
        read_layer({names[0]: good_pattern, names[1]: good_v}, 5)
    with pytest.raises(ValueError, match="disagree"):
        read_layer({names[0]: good_pattern, names[1]: torch.ones(1, 4, 2, 8)}, 0)
    with pytest.raises(ValueError, match="expected \\[batch, head, query_pos, key_pos\\]"):
        read_layer({names[0]: good_pattern[0], names[1]: good_v}, 0)
    with pytest.raises(ValueError, match="does not divide"):
        read_layer({names[0]: good_pattern, names[1]: torch.ones(1, 3, 3, 8)}, 0)
    with pytest.raises(ValueError, match="attention_mask has shape"):
        read_layer({names[0]: good_pattern, names[1]: good_v}, 0, attention_mask=torch.ones(1, 4))
    with pytest.raises(ValueError, match="non-negative int"):
        read_layer({names[0]: good_pattern, names[1]: good_v}, -1)


@pytest.mark.ill_typed
def test_stream_layers_bad_inputs():
    model = tiny_bridge()
    with pytest.raises(ValueError, match="out of range"):
        stream_layers(model, random_tokens(1, 4), lambda *a: None, layers=[3])
    with pytest.raises(TLGeometryError, match="integer tensor"):
        stream_layers(model, "some text", lambda *a: None)
    with pytest.raises(ValueError, match="contiguous"):
        stream_layers(model, random_tokens(1, 4), lambda *a: None, attention_mask=torch.tensor([[1, 0, 1, 1]]))


@pytest.mark.slow
def test_real_smollm2_streamed_forward(smollm2):
    tokens = smollm2.to_tokens(["The quick brown fox jumps over the lazy dog."])
    layers = _collect(smollm2, tokens)
    assert sorted(layers) == list(range(30))
    for att in layers.values():
        assert att.pattern.shape == (1, 9, tokens.shape[1], tokens.shape[1])
        assert att.v.shape == (1, tokens.shape[1], 9, 64) and att.n_kv_heads == 3
        torch.testing.assert_close(att.pattern.sum(-1), torch.ones(1, 9, tokens.shape[1]))
    assert bool(layers[0].has_bos.all())
    _, cache = smollm2.run_with_cache(tokens, names_filter=lambda n: n.startswith("blocks.7.attn.hook_") and n.split(".")[-1] in ("hook_pattern", "hook_v", "hook_z"))
    att = read_layer(cache, 7)
    torch.testing.assert_close(att.pattern, layers[7].pattern)
    z = torch.einsum("bhqk,bkhd->bqhd", att.pattern, att.v)
    torch.testing.assert_close(z, cache["blocks.7.attn.hook_z"], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("style", ["hooked", "mistral"])
def test_a_window_no_configuration_declares_is_told_by_the_pattern(style):
    model = tiny_windowed(style, layers=("global", "local", "global"), window=4)
    seen = {}
    stream_layers(model, random_tokens(2, 9), lambda layer, att: seen.setdefault(layer, att))
    assert unexplained_window(replace(seen[1], window=None)) == 4  # as a cache without its model reads it
    assert unexplained_window(replace(seen[1], window=6)) == 4  # a declared window wider than the model's
    assert unexplained_window(seen[1]) is None and unexplained_window(seen[0]) is None
    _, cache = model.run_with_cache(random_tokens(2, 9), names_filter=tlg.capture.names_filter)
    with pytest.warns(UserWarning, match=r"layer 1: every head's last query gives weight exactly 0 to each position "
                                         r"before its last 4,.* declares none"):
        analyze(dict(cache.items()), n=(1, 2), progress=False, bootstrap=10)


# Every entry that runs the model: (call on a model of context 64 and 65-token windows).
PAST_THE_CONTEXT = {
    "analyze": lambda m, t: tlg.analyze(m, t, 1, progress=False),
    "mean_nll": lambda m, t: mean_nll(m, t),
    "pruning_curve": lambda m, t: tlg.intervene.pruning_curve(m, t, {"random": torch.rand(3, 4)}, progress=False),
    "single_head_scan": lambda m, t: tlg.intervene.single_head_scan(m, t, progress=False),
    "topn_deletion": lambda m, t: tlg.intervene.topn_deletion(m, t, progress=False),
    "head_importance gradient": lambda m, t: tlg.intervene.head_importance(m, t, "gradient"),
    "head_importance entropy": lambda m, t: tlg.intervene.head_importance(m, t, "entropy"),
    "streaming_curve": lambda m, t: tlg.intervene.streaming_curve(m, t, orders="random", window=4, sink=1, progress=False),
    "head_types": lambda m, t: tlg.head_types(m, length=40),  # BOS + 2 × 40
}


@pytest.mark.parametrize("entry", list(PAST_THE_CONTEXT))
def test_every_entry_refuses_windows_past_the_context_before_any_forward(entry, monkeypatch):
    from ..tiny import tiny_model

    model = tiny_model(4, 2)

    def no_forward(*args, **kwargs):
        raise AssertionError("a forward ran on positions past the context")

    monkeypatch.setattr(model, "forward", no_forward)
    with pytest.raises(tlg.TLGeometryError, match="tokens per sequence exceed .*'s context of 64: cut the text"):
        PAST_THE_CONTEXT[entry](model, random_tokens(2, 65))
