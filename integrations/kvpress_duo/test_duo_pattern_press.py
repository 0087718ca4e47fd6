"""kvpress streams exactly the kv heads tl_geometry exported (run in .venv-kvpress by make kvpress-test).

The fixture (``export_fixture.py``, main venv) is the pattern of a real streaming curve and the kv
heads that curve streamed at each ratio; here a random Llama of the same shape runs kvpress's own
``DuoAttentionPress`` machinery on the pattern alone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from .duo_pattern_press import PatternDuoAttentionPress, read_pattern

FIXTURE = Path(os.environ.get("TLG_KVPRESS_FIXTURE", ".kvpress-fixture"))


@pytest.fixture(scope="module")
def expected():
    if not (FIXTURE / "expected.json").is_file():
        pytest.fail(f"no fixture in {FIXTURE}: run python -m integrations.kvpress_duo.export_fixture {FIXTURE} in the main venv")
    return json.loads((FIXTURE / "expected.json").read_text())


@pytest.fixture(scope="module")
def model(expected):
    shape = expected["shape"]
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=shape["n_layers"],
                         num_attention_heads=shape["n_heads"], num_key_value_heads=shape["n_kv_heads"],
                         max_position_embeddings=128)
    config._attn_implementation = "sdpa"  # DuoAttentionPress refuses eager attention
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def _mask_of(streamed: list[int], layers: int, kv: int) -> torch.Tensor:
    mask = torch.zeros(layers * kv, dtype=torch.bool)
    mask[streamed] = True
    return mask.reshape(layers, kv)


def test_the_pattern_reads_as_exported(expected):
    sink, recent, scores = read_pattern(FIXTURE / "pattern")
    shape = expected["shape"]
    assert (sink, recent) == (expected["sink"], expected["window"])
    assert scores.shape == (shape["n_layers"], shape["n_kv_heads"]) and len(set(scores.flatten().tolist())) == scores.size


@pytest.mark.parametrize("ratio", ["0.25", "0.5", "0.75", "1.0"])
def test_kvpress_streams_exactly_the_exported_heads(expected, model, ratio):
    shape = expected["shape"]
    want = _mask_of(expected["streamed"][ratio], shape["n_layers"], shape["n_kv_heads"])
    press = PatternDuoAttentionPress(head_compression_ratio=float(ratio), pattern=str(FIXTURE / "pattern"))
    tokens = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), press(model):  # prefill: each attention layer's compress marks the keys to mask
        model(tokens)
    assert torch.equal(press.streaming_mask.cpu(), want)
    for layer, block in enumerate(model.model.layers):
        batch, heads, positions = block.self_attn.masked_key_indices
        assert sorted(set(heads.tolist())) == want[layer].nonzero().flatten().tolist()  # the streamed kv heads only
        kept = set(range(expected["sink"])) | set(range(40 - expected["window"], 40))
        middle = set(range(40)) - kept if bool(want[layer].any()) else set()
        assert set(positions.tolist()) == middle  # all but the sink and the recent window, of streamed heads
        block.self_attn.masked_key_indices = None


def test_a_pattern_of_another_shape_is_refused(model, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"sink_size": 1, "recent_size": 4}))
    (tmp_path / "full_attention_heads.tsv").write_text("0.1\t0.2\t0.3\n")
    with pytest.raises(ValueError, match="export the pattern of this model"):
        PatternDuoAttentionPress(head_compression_ratio=0.5, pattern=str(tmp_path)).post_init_from_model(model)
