"""Hooks left attached are found; deliberate ones (contexts, tl_geometry's ablations, permanent) are not."""

from __future__ import annotations

import warnings

import pytest

import tl_geometry as tlg
from tl_geometry.capture.hooks import foreign_hooks

from ..inputs import FEW_VOTES_WARNING
from ..tiny import random_tokens


def _identity(z, hook):
    return z


def test_a_leftover_hook_is_found_and_deliberate_ones_are_not(tiny_model):
    model = tiny_model
    assert foreign_hooks(model) == []
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", _identity)]):
        assert foreign_hooks(model) == []  # TransformerLens's context: deliberate
    with tlg.intervene.ablate_heads(model, [(0, 1)]):
        assert foreign_hooks(model) == []  # tl_geometry's own ablation
    model.add_hook("blocks.1.attn.hook_z", _identity)
    try:
        assert len(foreign_hooks(model)) == 1 and "blocks.1.attn" in foreign_hooks(model)[0]
    finally:
        model.reset_hooks()
    assert foreign_hooks(model) == []


def test_analyze_warns_once_about_leftover_hooks_unless_told(tiny_model):
    model, tokens = tiny_model, random_tokens(2, 8)
    model.add_hook("blocks.1.attn.hook_z", _identity)
    try:
        with pytest.warns(UserWarning, match=r"hooks attached at .*blocks\.1\.attn.*model\.reset_hooks\(\)"):
            tlg.analyze(model, tokens, 1, repeats=0, bootstrap=1, progress=False)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            warnings.filterwarnings("ignore", message=FEW_VOTES_WARNING)
            tlg.analyze(model, tokens, 1, repeats=0, bootstrap=1, progress=False, allow_hooks=True)
    finally:
        model.reset_hooks()
    with warnings.catch_warnings():  # the README's "geometry of a patched run": no warning
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=FEW_VOTES_WARNING)
        with tlg.intervene.ablate_heads(model, [(0, 1)], mode="sink"):
            tlg.analyze(model, tokens, 1, repeats=0, bootstrap=1, progress=False)
