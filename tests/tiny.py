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
