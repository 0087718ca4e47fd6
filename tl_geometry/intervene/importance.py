"""Head importance baselines (docs/metrics.md#interventions): weight magnitude, attention entropy,
loss gradient, random and the taxonomy's, each a ``[n_layers, n_heads]`` score (higher: keep)."""

from __future__ import annotations

from typing import Any, get_args

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..capture.adapters import sequence_nll, stream_layers
from ..capture.hooks import (
    z_hook_name,
)
from ..capture.model_info import ModelInfo, attention_weights, describe_model
from ..config import ImportanceMethod
from ..errors import TLGeometryError
from ..label.taxonomy import HeadTaxonomy
from .ablation import window_batches

__all__ = ["head_importance", "taxonomy_importance", "IMPORTANCE_METHODS"]

IMPORTANCE_METHODS = get_args(ImportanceMethod)


def _magnitude(model, info: ModelInfo) -> Tensor:
    rows = []
    for layer in range(info.n_layers):
        weights = attention_weights(model, layer)
        rows.append(sum(w.double().pow(2).sum((1, 2)) for w in weights.values()).sqrt())
    return torch.stack(rows).float()


def _entropy(model, info: ModelInfo, tokens, mask, batch_size) -> Tensor:
    sums = torch.zeros(info.n_layers, info.n_heads, dtype=torch.float64)
    count = torch.zeros((), dtype=torch.float64)

    def on_layer(layer, att):
        p = att.pattern.double()
        entropy = -(p * p.clamp_min(1e-300).log()).sum(-1)  # [batch, head, query]
        sums[layer] += (entropy * att.query_mask[:, None, :]).sum((0, 2)).cpu()

    for batch_tokens, batch_mask in window_batches(tokens, mask, batch_size):
        stream_layers(model, batch_tokens, on_layer, attention_mask=batch_mask, info=info)
        count += batch_tokens.numel() if batch_mask is None else batch_mask.sum()
    return (-(sums / count)).float()  # diffuse (high-entropy) heads are removed first


def _gradient(model, info: ModelInfo, tokens, mask, batch_size) -> Tensor:
    """Michel et al. (2019): E_x |∂L(x)/∂ξ_h| for a gate ξ on each head's hook_z, ℓ2-normalised per layer."""
    total = torch.zeros(info.n_layers, info.n_heads, dtype=torch.float64)
    n_seq = 0
    for batch_tokens, batch_mask in window_batches(tokens, mask, batch_size):
        # One gate per sequence and head: one backward gives every sequence's own gradient.
        gates = torch.ones(batch_tokens.shape[0], info.n_layers, info.n_heads, requires_grad=True)

        def gate(z: Tensor, hook, gates=gates) -> Tensor:
            layer = int(hook.name.split(".")[1])
            return z * gates[:, layer, None, :, None].to(z.dtype).to(z.device)

        with torch.enable_grad():
            nll, n = sequence_nll(model, batch_tokens, attention_mask=batch_mask,
                                  fwd_hooks=[(z_hook_name(layer), gate) for layer in range(info.n_layers)])
            # autograd.grad, not backward(): the model's own .grad stays untouched
            (grad,) = torch.autograd.grad((nll / n.clamp_min(1)).sum(), gates)
        total += grad.abs().double().sum(0)
        n_seq += batch_tokens.shape[0]
    mean = total / n_seq
    return (mean / mean.norm(dim=1, keepdim=True).clamp_min(1e-30)).float()


def taxonomy_importance(taxonomy: HeadTaxonomy) -> Float[Tensor, "layer head"]:
    """Importance from taxonomy outputs only: mixers (0) < resets (1) < retrievers (2), and within
    a regime, the larger a head's share of sink votes the less important (``base + 1 − share_sink``).
    The lowest are removed first."""
    base = torch.tensor([2.0, 0.0, 1.0])[taxonomy.label_ids]  # retriever, mixer, reset
    return base + 1 - taxonomy.shares[..., 1].nan_to_num(0.0)


def head_importance(
    model: Any,
    tokens: Int[Tensor, "batch pos"] | None = None,
    method: ImportanceMethod = "gradient",
    *,
    attention_mask: Tensor | None = None,
    taxonomy: HeadTaxonomy | None = None,
    seed: int = 0,
    batch_size: int = 8,
) -> Float[Tensor, "layer head"]:
    """Per-head importance ``[n_layers, n_heads]`` (higher = keep longer).

    Methods: ``"magnitude"`` (Frobenius norm of the head's ``W_Q``, ``W_K``, ``W_V``, ``W_O``
    slices together; K and V are those of the kv head it reads), ``"entropy"`` (minus the mean
    attention entropy over non-pad queries: diffuse heads go first), ``"gradient"`` (Michel et
    al. 2019), ``"random"`` (seeded uniform), ``"taxonomy"`` (:func:`taxonomy_importance`; pass
    ``taxonomy`` or it is computed from ``tokens``).
    """
    if method not in IMPORTANCE_METHODS:
        raise TLGeometryError(f"method must be one of {IMPORTANCE_METHODS}; got {method!r}.")
    info = describe_model(model)
    if tokens is not None:
        info.check_length(tokens.shape[-1])
    if method == "magnitude":
        return _magnitude(model, info)
    if method == "random":
        return torch.rand(info.n_layers, info.n_heads, generator=torch.Generator().manual_seed(seed))
    if method == "taxonomy" and taxonomy is not None:
        return taxonomy_importance(taxonomy)
    if tokens is None:
        raise TLGeometryError(f"method {method!r} needs tokens.")
    if method == "taxonomy":  # the taxonomy's pass, with the least geometry beside it
        from ..run.analysis import analyze

        run = analyze(model, tokens, 1, attention_mask=attention_mask, repeats=0, sink=False, bootstrap=1,
                      batch_size=batch_size, progress=False)
        return taxonomy_importance(run.taxonomy)
    if method == "entropy":
        return _entropy(model, info, tokens, attention_mask, batch_size)
    return _gradient(model, info, tokens, attention_mask, batch_size)
