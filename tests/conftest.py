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



@pytest.fixture
def finished_run(tmp_path):
    """A real finished run folder of a tiny model (the settings a CLI run writes)."""
    import tl_geometry as tlg
    from tl_geometry.run.run_folder import RunFolder

    from .tiny import random_tokens, tiny_model

    analysis = tlg.analyze(tiny_model(4, 2), random_tokens(2, 12, seed=1), (1, 2), repeats=1, bootstrap=10,
                           progress=False)
    run = RunFolder(tmp_path / "run")
    run.write_analysis(analysis, {"cli_model": "smollm2-135m", "seed": 0, "corpus_spec": "python-reference"}, {})
    return run
