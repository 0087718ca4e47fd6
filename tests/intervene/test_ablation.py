"""Ablations against hand-made hooks: zero, mean, sink and window modes, every head convention, bad input."""

from __future__ import annotations

from typing import get_args

import pytest
import torch

import tl_geometry as tlg
from tl_geometry.intervene.ablation import ablate_heads, ablate_regime
from tl_geometry.label.taxonomy import HeadTaxonomy

from ..tiny import random_tokens


def _logits(model, tokens, hooks=()):
    with torch.no_grad():
        return model.run_with_hooks(tokens, fwd_hooks=list(hooks))


def test_zero_equals_zeroing_hook_z_by_hand(tiny_model):
    tokens = random_tokens(2, 8)

    def by_hand(z, hook):
        z = z.clone()
        z[:, :, 3] = 0
        return z

    expected = _logits(tiny_model, tokens, [("blocks.1.attn.hook_z", by_hand)])
    with ablate_heads(tiny_model, [(1, 3)]):
        got = _logits(tiny_model, tokens)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
    assert not torch.equal(got, _logits(tiny_model, tokens))  # the ablation did something
    assert torch.equal(_logits(tiny_model, tokens), _logits(tiny_model, tokens))  # hooks removed on exit


def test_no_heads_changes_nothing_bitwise(tiny_model):
    tokens = random_tokens(2, 8)
    base = _logits(tiny_model, tokens)
    for mode in ("zero", "sink", "mean"):
        ablation = ablate_heads(tiny_model, [], mode=mode, reference_tokens=tokens)
        with ablation:
            assert torch.equal(_logits(tiny_model, tokens), base)


def test_sink_mode_makes_the_pattern_one_hot_on_position_0(tiny_model):
    tokens = random_tokens(2, 8)
    seen = {}

    def grab_z(z, hook):
        seen["z"] = z.clone()

    def grab_v(v, hook):
        seen["v"] = v.clone()

    ablation = ablate_heads(tiny_model, [(2, 1), (2, 2)], mode="sink")
    _logits(tiny_model, tokens, [*ablation.fwd_hooks, ("blocks.2.attn.hook_z", grab_z), ("blocks.2.attn.hook_v", grab_v)])
    n_heads, n_kv = tiny_model.cfg.n_heads, seen["v"].shape[2]
    for head in (1, 2):
        kv = head // (n_heads // n_kv)
        torch.testing.assert_close(seen["z"][:, :, head], seen["v"][:, :1, kv].expand(-1, 8, -1))


def test_mean_mode_uses_non_pad_positions_only(tiny_model):
    tokens = random_tokens(3, 8, seed=4)
    mask = torch.ones(3, 8, dtype=torch.long)
    mask[1, 5:] = 0
    other_pads = tokens.clone()
    other_pads[1, 5:] = (tokens[1, 5:] + 7) % 40 + 1  # different pad tokens, same real ones
    seen = {}

    def grab(z, hook):
        seen["z"] = z.clone()

    with torch.no_grad():
        tiny_model.run_with_hooks(tokens, attention_mask=mask, fwd_hooks=[("blocks.0.attn.hook_z", grab)])
    real = mask.bool()[:, :, None, None]
    expected = (seen["z"].double() * real).sum((0, 1)) / real.sum()
    for reference in (tokens, other_pads):
        ablation = ablate_heads(tiny_model, [(0, 2)], mode="mean", reference_tokens=reference, reference_mask=mask)
        out = {}

        def after(z, hook, out=out):
            out["z"] = z.clone()

        _logits(tiny_model, random_tokens(1, 6), [*ablation.fwd_hooks, ("blocks.0.attn.hook_z", after)])
        torch.testing.assert_close(out["z"][0, :, 2].double(), expected[2].expand(6, -1), atol=1e-6, rtol=1e-6)


@pytest.mark.ill_typed
def test_ablate_regime_and_bad_input(tiny_model):
    votes = torch.zeros(tiny_model.cfg.n_layers, tiny_model.cfg.n_heads, 3, dtype=torch.long)
    votes[..., 2] = 5
    votes[0, :2, 1] = 9  # two mixers
    tax = HeadTaxonomy.from_votes(votes)
    assert ablate_regime(tiny_model, tax, "mixer").heads == [(0, 0), (0, 1)]
    resets = tax.heads("reset")
    picks = {seed: ablate_regime(tiny_model, tax, "reset", k=3, seed=seed).heads for seed in range(6)}
    for chosen in picks.values():
        assert len(chosen) == 3 and set(chosen) <= set(resets) and chosen == sorted(chosen)
    assert picks[1] == ablate_regime(tiny_model, tax, "reset", k=3, seed=1).heads  # seeded
    assert len({tuple(chosen) for chosen in picks.values()}) > 1  # and the seed matters
    with pytest.raises(ValueError, match="out of range"):
        ablate_heads(tiny_model, [(99, 0)])
    with pytest.raises(ValueError, match="reference_tokens"):
        ablate_heads(tiny_model, [(0, 0)], mode="mean")
    with pytest.raises(ValueError, match="mode must be"):
        ablate_heads(tiny_model, [(0, 0)], mode="nope")
    assert get_args(tlg.intervene.ImportanceMethod) == ("magnitude", "entropy", "gradient", "random", "taxonomy")


def test_entering_the_same_ablation_twice_is_refused_and_leaks_nothing(tiny_model):
    tokens = random_tokens(2, 8)
    clean = _logits(tiny_model, tokens)
    ablation = ablate_heads(tiny_model, [(1, 3)])
    with ablation:
        with pytest.raises(tlg.TLGeometryError, match="already active"):
            with ablation:
                pass
    assert torch.equal(_logits(tiny_model, tokens), clean)  # every hook gone after the block
    with ablation:  # and it can be entered again afterwards
        assert not torch.equal(_logits(tiny_model, tokens), clean)
    assert torch.equal(_logits(tiny_model, tokens), clean)


def test_another_models_taxonomy_is_refused(tiny_model):
    layers, heads = tiny_model.cfg.n_layers, tiny_model.cfg.n_heads
    other = HeadTaxonomy.from_votes(torch.ones(layers + 1, heads, 3, dtype=torch.long), settings={"model": "other"})
    with pytest.raises(tlg.TLGeometryError, match=rf"{layers + 1}×{heads} heads \(model 'other'\).*{layers}×{heads}"):
        ablate_regime(tiny_model, other, "reset")


@pytest.mark.ill_typed
@pytest.mark.parametrize(("heads", "message"), [
    ([(0.0, 1.5)], "heads are"), ([(0, 1, 2)], "heads are"), ([1.0], "heads are"), (["L0X1"], "heads are"),
    (torch.tensor([0.5]), "tensor of shape"), ((0, 1), "ambiguous"), ("L9H0", "out of range"), (99, "out of range"),
    (torch.zeros(2, 2, dtype=torch.bool), "boolean head mask must be"),
])
def test_heads_in_no_convention_are_refused_with_one_line(tiny_model, heads, message):
    with pytest.raises(tlg.TLGeometryError, match=message):
        ablate_heads(tiny_model, heads)


def test_every_head_convention_ablates_the_same_heads(tiny_model):
    """Pairs, names, flat indices (a list, topk's tensor), index pairs and a boolean mask."""
    n_layers, n_heads = tiny_model.cfg.n_layers, tiny_model.cfg.n_heads
    tokens = random_tokens(2, 8)
    wanted = [(0, 1), (2, n_heads - 1)]
    mask = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    mask[0, 1] = mask[2, n_heads - 1] = True
    scores = torch.zeros(n_layers, n_heads)
    scores[0, 1], scores[2, n_heads - 1] = 2.0, 1.0
    conventions = [wanted, ["L0H1", f"L2H{n_heads - 1}"], [1, 2 * n_heads + n_heads - 1],
                   scores.flatten().topk(2).indices, torch.tensor(wanted), mask, [(0, 1), f"L2H{n_heads - 1}"]]
    with ablate_heads(tiny_model, wanted):
        expected = _logits(tiny_model, tokens)
    for heads in conventions:
        with ablate_heads(tiny_model, heads) as ablation:
            assert sorted(ablation.heads) == wanted
            assert torch.equal(_logits(tiny_model, tokens), expected)


@pytest.mark.parametrize("factory", ["hooked-gqa", "hooked-mha", "bridge-gqa", "bridge-mqa"])
def test_window_equals_masking_the_scores_by_hand(factory):
    # StreamingLLM-style attention for heads 1 and 2 of layer 1: keys < sink and the last `window`
    # keys up to the query, against -inf written into those heads' attention scores by hand
    from ..tiny import MODEL_FACTORIES

    model = MODEL_FACTORIES[factory]()
    tokens = random_tokens(2, 24)
    window, sink, heads = 5, 2, [1, 2]
    base = _logits(model, tokens)
    scores_hook = "blocks.1.attn.hook_attn_scores"

    def mask_scores(scores, hook):
        query = torch.arange(scores.shape[-2])[:, None]
        key = torch.arange(scores.shape[-1])[None, :]
        drop = ~((key < sink) | (key > query - window))
        scores = scores.clone()
        scores[:, heads] = scores[:, heads].masked_fill(drop, -torch.inf)
        return scores

    def by_hand_from_pattern():
        # where the scores hook is not consumed (the bridge delegates to the HF module): the
        # pattern's logarithms are the scores up to a constant per row; mask those, softmax, and
        # set the heads' z from hook_v
        state = {}

        def keep_v(v, hook):
            state["v"] = v

        def masked_softmax(pattern, hook):
            state["rows"] = mask_scores(pattern.log(), hook)[:, heads].softmax(-1)

        def set_z(z, hook):
            v = state["v"].repeat_interleave(z.shape[2] // state["v"].shape[2], 2)[:, :, heads]
            z = z.clone()
            z[:, :, heads] = torch.einsum("bhqk,bkhd->bqhd", state["rows"], v)
            return z

        return [("blocks.1.attn.hook_v", keep_v), ("blocks.1.attn.hook_pattern", masked_softmax),
                ("blocks.1.attn.hook_z", set_z)]

    import warnings

    got = _window_logits_or_skip(model, tokens, [(1, h) for h in heads], window, sink)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the bridge says it discards an edited hook_attn_scores
        expected = _logits(model, tokens, [(scores_hook, mask_scores)])
    if torch.equal(expected, base):
        expected = _logits(model, tokens, by_hand_from_pattern())
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
    assert torch.equal(_logits(model, tokens), base)  # nothing left after the with-block


def _window_logits_or_skip(model, tokens, heads, window, sink, fwd_hooks=()):
    """Logits with ``heads`` streaming; skips (after checking the error and that no hook stays)
    on the model class that reports its pattern after using it."""
    try:
        with ablate_heads(model, heads, mode="window", window=window, sink=sink):
            return _logits(model, tokens, fwd_hooks)
    except tlg.TLGeometryError as exc:
        assert "before it reports hook_pattern" in str(exc)
        assert torch.equal(_logits(model, tokens), _logits(model, tokens))
        pytest.skip("this model class cannot override attention patterns (TransformerLens 3.x bridge)")


def test_window_keeps_the_sink_and_the_recent_keys(tiny_model):
    tokens = random_tokens(1, 20)
    seen = {}

    def grab(pattern, hook):
        seen["pattern"] = pattern.detach().clone()

    _window_logits_or_skip(tiny_model, tokens, [(0, 1)], 3, 1, [("blocks.0.attn.hook_pattern", grab)])
    rows = seen["pattern"][0, 1]
    query, key = torch.arange(20)[:, None], torch.arange(20)[None, :]
    outside = ~((key < 1) | ((key > query - 3) & (key <= query)))
    assert rows[outside].abs().max() == 0
    torch.testing.assert_close(rows.sum(-1), torch.ones(20))
    assert (seen["pattern"][0, 0][outside] > 0).any()  # the other heads keep their whole context


@pytest.mark.ill_typed
@pytest.mark.parametrize("window, sink, fault", [(0, 4, "window must"), (64, -1, "sink must"), (2.5, 4, "window must"),
                                                 (True, 4, "window must")])
def test_bad_windows_are_refused(tiny_model, window, sink, fault):
    with pytest.raises(tlg.TLGeometryError, match=fault):
        ablate_heads(tiny_model, [(0, 1)], mode="window", window=window, sink=sink)


def test_mean_ablations_reference_windows_are_checked_against_the_context(tiny_model):
    from tl_geometry.errors import TLGeometryError
    from tl_geometry.intervene import ablate_heads

    n_ctx = tiny_model.cfg.n_ctx
    too_long = torch.zeros(1, n_ctx + 1, dtype=torch.long)
    with pytest.raises(TLGeometryError, match="context"):
        with ablate_heads(tiny_model, [(0, 0)], mode="mean", reference_tokens=too_long):
            pass
