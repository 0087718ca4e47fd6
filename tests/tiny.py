"""Tiny random models of both TransformerLens classes (milliseconds, no files)."""

from __future__ import annotations

import pytest
import torch

D_VOCAB = 50


def tiny_bridge(n_heads: int = 4, n_kv_heads: int | None = 2, n_layers: int = 3, seed: int = 0):
    """A random TransformerBridge (LLaMA-like: RMSNorm, rotary, GQA), built in milliseconds."""
    try:
        from transformer_lens.config import TransformerBridgeConfig
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError as exc:  # TransformerLens 2.x has no bridge
        pytest.skip(f"TransformerBridge unavailable: {exc}")
    if not hasattr(TransformerBridge, "boot_native"):
        pytest.skip("this TransformerLens has no TransformerBridge.boot_native for tiny random bridges")
    cfg = TransformerBridgeConfig(
        d_model=32, d_head=8, n_layers=n_layers, n_ctx=64, n_heads=n_heads, d_vocab=D_VOCAB,
        n_key_value_heads=n_kv_heads, act_fn="gelu", normalization_type="RMS",
        positional_embedding_type="rotary", seed=seed,
    )
    return TransformerBridge.boot_native(cfg).eval()


def tiny_hooked(n_heads: int = 4, n_kv_heads: int | None = 2, n_layers: int = 3, seed: int = 0, **extra):
    """A random HookedTransformer (TransformerLens 2.x/3.x only; skipped on 4.x)."""
    try:
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except Exception as exc:  # 4.x removed the class (the import raises)
        pytest.skip(f"HookedTransformer unavailable in this TransformerLens ({exc}); run `make legacy-test`")
    cfg = HookedTransformerConfig(
        d_model=32, d_head=8, n_layers=n_layers, n_ctx=64, n_heads=n_heads, d_vocab=D_VOCAB,
        n_key_value_heads=n_kv_heads, act_fn="gelu", normalization_type="RMS",
        positional_embedding_type="rotary", seed=seed, **extra,
    )
    return HookedTransformer(cfg).eval()


def tiny_model(n_heads: int = 4, n_kv_heads: int | None = 2, n_layers: int = 3, seed: int = 0):
    """A tiny random model of the class this TransformerLens has: the bridge (3.x/4.x), else a
    HookedTransformer (2.x). For tests where the model class does not matter."""
    try:
        from transformer_lens.model_bridge import TransformerBridge  # noqa: F401
    except ImportError:
        return tiny_hooked(n_heads, n_kv_heads, n_layers, seed)
    return tiny_bridge(n_heads, n_kv_heads, n_layers, seed)


def tiny_streamable(n_heads: int = 4, n_kv_heads: int | None = 2, n_layers: int = 3, seed: int = 0):
    """A tiny random model whose attention patterns can be overridden: a HookedTransformer where
    this TransformerLens has one (2.x/3.x: the 3.x bridge reports its pattern after using it),
    else the 4.x bridge."""
    try:
        return tiny_hooked(n_heads, n_kv_heads, n_layers, seed)
    except pytest.skip.Exception:
        return tiny_bridge(n_heads, n_kv_heads, n_layers, seed)


# Sliding-window configuration styles: HookedTransformer's, and the Hugging Face ones a bridge reads.
WINDOW_STYLES = ("hooked", "gemma2", "gemma3", "mistral", "qwen2", "gpt-neo")


def _tiny_tokenizer():
    """A word-level tokenizer of D_VOCAB ids ("t0" …), BOS "t1", saved to a folder so TransformerLens
    can reload it offline."""
    import tempfile

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(D_VOCAB)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = tempfile.mkdtemp(prefix="tlg-tiny-tokenizer-")
    PreTrainedTokenizerFast(tokenizer_object=words, bos_token="t1", eos_token="t2", pad_token="t3",
                            unk_token="t0").save_pretrained(folder)
    return PreTrainedTokenizerFast.from_pretrained(folder)


def tiny_windowed(style: str, layers: tuple[str, ...] = ("local", "global", "local"), window: int = 4, seed: int = 0):
    """A tiny random model whose ``"local"`` layers attend to the last ``window`` positions, configured
    in one of ``WINDOW_STYLES``: a HookedTransformer (``attn_types`` + ``window_size``; TransformerLens
    2.x/3.x) or a TransformerBridge over a random Hugging Face model (``sliding_window`` +
    ``layer_types``, Mistral's ``sliding_window`` on every layer, Qwen2's ``max_window_layers``,
    GPT-Neo's ``window_size`` + ``attention_layers``), GQA where the architecture has it."""
    if style == "hooked":
        model = tiny_hooked(4, 2, len(layers), seed, use_local_attn=True, window_size=window, attn_types=list(layers))
        model.set_tokenizer(_tiny_tokenizer())
        return model
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError as exc:
        pytest.skip(f"TransformerBridge unavailable: {exc}")
    import transformers

    n = len(layers)
    kinds = ["sliding_attention" if kind == "local" else "full_attention" for kind in layers]
    common = dict(vocab_size=D_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=n, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, sliding_window=window)
    if style == "gemma2":
        config = transformers.Gemma2Config(**common, head_dim=8, layer_types=kinds)
    elif style == "gemma3":
        config = transformers.Gemma3TextConfig(**common, head_dim=8, layer_types=kinds)
    elif style == "mistral":  # one window on every layer: the global layers' reach is the window's
        config = transformers.MistralConfig(**common)
    elif style == "qwen2":  # the layers from max_window_layers on slide
        first = layers.index("local")
        assert all(kind == "local" for kind in layers[first:]), "Qwen2 slides from one layer on"
        config = transformers.Qwen2Config(**common, use_sliding_window=True, max_window_layers=first)
    elif style == "gpt-neo":
        config = transformers.GPTNeoConfig(vocab_size=D_VOCAB, hidden_size=32, num_layers=n, num_heads=4,
                                           max_position_embeddings=64, window_size=window,
                                           attention_types=[[[kind], 1] for kind in layers])
    else:
        raise ValueError(style)
    torch.manual_seed(seed)
    hf_model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    config.architectures = [type(hf_model).__name__]
    import contextlib
    import io
    import logging

    with contextlib.redirect_stderr(io.StringIO()):
        logging.disable(logging.WARNING)
        try:
            model = TransformerBridge.boot_transformers(config.architectures[0], hf_model=hf_model,
                                                        tokenizer=_tiny_tokenizer())
        finally:
            logging.disable(logging.NOTSET)
    return model.eval()


MODEL_FACTORIES = {
    "bridge-gqa": lambda: tiny_bridge(4, 2),
    "bridge-mqa": lambda: tiny_bridge(4, 1),
    "bridge-mha": lambda: tiny_bridge(4, None),
    "hooked-gqa": lambda: tiny_hooked(4, 2),
    "hooked-mha": lambda: tiny_hooked(4, None),
}


def random_tokens(batch: int, pos: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, D_VOCAB, (batch, pos), generator=gen)
