"""Shared fixtures: tiny random models of both TransformerLens classes, and the real SmolLM2."""

from __future__ import annotations

import pytest

from .tiny import MODEL_FACTORIES


@pytest.fixture(params=list(MODEL_FACTORIES), scope="module")
def tiny_model(request):
    """Each tiny model class/GQA layout in turn."""
    return MODEL_FACTORIES[request.param]()


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M (offline, from the cache after the first build)."""
    from tl_geometry import load_model

    return load_model("smollm2-135m")

