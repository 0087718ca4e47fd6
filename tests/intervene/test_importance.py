"""Importance baselines against direct computations (autograd, entropy, weight norms) and their rules."""

from __future__ import annotations

import torch

from tl_geometry.intervene.importance import head_importance, taxonomy_importance
from tl_geometry.intervene.pruning import heads_to_remove
from tl_geometry.label.taxonomy import HeadTaxonomy

from ..tiny import random_tokens


def test_gradient_importance_equals_direct_autograd(tiny_model):
    tokens = random_tokens(3, 7, seed=1)
    got = head_importance(tiny_model, tokens, "gradient", batch_size=2)
    layers, heads = tiny_model.cfg.n_layers, tiny_model.cfg.n_heads
    total = torch.zeros(layers, heads, dtype=torch.float64)
    for row in tokens:  # one sequence at a time, a plain [layer, head] gate
        gate = torch.ones(layers, heads, requires_grad=True)
        hooks = [(f"blocks.{layer}.attn.hook_z", lambda z, hook, layer=layer, gate=gate: z * gate[layer, None, :, None])
                 for layer in range(layers)]
        logits = tiny_model.run_with_hooks(row[None], fwd_hooks=hooks)
        loss = torch.nn.functional.cross_entropy(logits[0, :-1].double(), row[1:])
        (grad,) = torch.autograd.grad(loss, gate)
        total += grad.abs().double()
    expected = total / 3
    expected = expected / expected.norm(dim=1, keepdim=True)
    torch.testing.assert_close(got, expected.float(), atol=1e-5, rtol=1e-4)
    assert all(p.grad is None for p in tiny_model.parameters())  # the model's grads are untouched


def test_entropy_importance_is_minus_the_mean_attention_entropy(tiny_model):
    tokens = random_tokens(3, 7, seed=6)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, 4:] = 0
    got = head_importance(tiny_model, tokens, "entropy", attention_mask=mask, batch_size=2)
    layers, heads = tiny_model.cfg.n_layers, tiny_model.cfg.n_heads
    expected = torch.zeros(layers, heads, dtype=torch.float64)
    queries = 0
    for row, row_mask in zip(tokens, mask, strict=True):  # one sequence alone, its real tokens only
        length = int(row_mask.sum())
        _, cache = tiny_model.run_with_cache(row[None, :length])
        for layer in range(layers):
            p = cache[f"blocks.{layer}.attn.hook_pattern"][0].double()  # [head, query, key]
            expected[layer] += -(p * torch.where(p > 0, p.log(), 0.0)).sum((-1, -2))
        queries += length
    torch.testing.assert_close(got, (-expected / queries).float(), atol=1e-5, rtol=1e-5)


def test_magnitude_is_the_documented_norm(tiny_model):
    got = head_importance(tiny_model, method="magnitude")
    attn = tiny_model.blocks[1].attn
    group = tiny_model.cfg.n_heads // attn.W_K.shape[0] if attn.W_K.shape[0] != tiny_model.cfg.n_heads else 1
    head, kv = 3, 3 // group
    expected = torch.sqrt(attn.W_Q[head].pow(2).sum() + attn.W_K[kv].pow(2).sum() + attn.W_V[kv].pow(2).sum()
                          + attn.W_O[head].pow(2).sum())
    torch.testing.assert_close(got[1, 3], expected.detach().float())


def test_random_and_taxonomy_importance_rules():
    votes = torch.tensor([[[9, 1, 0], [0, 8, 2], [1, 1, 8]], [[0, 10, 0], [2, 2, 2], [7, 2, 1]]])
    tax = HeadTaxonomy.from_votes(votes)
    imp = taxonomy_importance(tax)
    removed = heads_to_remove(imp, 0.5)  # 3 of 6: both mixers (most sink-dominated first), then a reset
    assert removed == [(1, 0), (0, 1), (1, 1)]
    assert heads_to_remove(imp, 1.0) == [] and len(heads_to_remove(imp, 0.0)) == 6
