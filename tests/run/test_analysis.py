"""The one-pass notebook entry point: equals the separate passes, texts in, save/load, tables."""

from __future__ import annotations

import warnings

import pytest
import torch

import tl_geometry as tlg
from tl_geometry.capture.model_info import describe_model
from tl_geometry.errors import TLGeometryError
from tl_geometry.measure.votes import vote_counts

from ..inputs import FEW_VOTES_WARNING
from ..oracle import oracle_separability
from ..tiny import D_VOCAB, WINDOW_STYLES, random_tokens, tiny_model, tiny_windowed


def test_one_pass_equals_separate_passes_and_per_layer_votes(tmp_path):
    model = tiny_model(4, 2)
    tokens = random_tokens(5, 9, seed=2)
    res = tlg.analyze(model, tokens, (1, 2, 4), repeats=2, batch_size=2, progress=False, bootstrap=20)
    alone = tlg.analyze(model, tokens, (1, 2, 4), repeats=2, batch_size=5, progress=False, bootstrap=20).geometry
    for key, value in alone.per_sequence.items():
        torch.testing.assert_close(res.geometry.per_sequence[key], value, equal_nan=True, atol=1e-6, rtol=0)
    # Independently: the public kernel on each layer of a cached run, last query of each window.
    _, cache = model.run_with_cache(tokens)
    for layer in range(3):
        att = tlg.capture.read_layer(cache, layer)
        sep = tlg.separability(att.pattern, att.kv_values, (1, 2, 4), queries="last")
        torch.testing.assert_close(res.geometry.per_sequence["f_top"][:, layer], sep.f[:, :, 0], atol=1e-6, rtol=0)
    tax = tlg.analyze(model, tokens, 1, repeats=0, sink=False, batch_size=3, progress=False, bootstrap=1).taxonomy
    assert torch.equal(tax.votes, res.taxonomy.votes) and torch.equal(tax.offsets, res.taxonomy.offsets)
    _, cache = model.run_with_cache(tokens)
    att = tlg.capture.read_layer(cache, 2)
    assert torch.equal(res.taxonomy.votes[2], vote_counts(att.pattern, att.v).sum(0))
    table = res.heads_table()
    assert len(table) == 3 * 4 and table["name"].iloc[5] == "L1H1"
    assert table["regime"].tolist() == [label for row in res.taxonomy.labels for label in row]
    gap = res.geometry.mean("f_top") - res.geometry.mean("f_random")
    assert torch.allclose(torch.tensor(table["gap@2"].to_numpy()), gap[..., 1].reshape(-1).double(), equal_nan=True)
    assert torch.allclose(torch.tensor(table["norm_ratio"].to_numpy()),
                          res.geometry.mean("norm_ratio").reshape(-1).double(), equal_nan=True)
    means = res.regime_means("align_sink")
    align = res.geometry.mean("align_sink").reshape(12, 3).double()
    for regime in means.index:  # a plain per-regime mean over the table's heads
        rows = [i for i, label in enumerate(table["regime"]) if label == regime]
        expected = align[rows].nanmean(0) if rows else torch.full((3,), float("nan"), dtype=torch.float64)
        assert torch.allclose(torch.tensor(means.loc[regime].to_numpy(dtype=float)), expected, equal_nan=True)
    res.save(tmp_path / "run")
    back = tlg.Analysis.load(tmp_path / "run")
    assert torch.equal(back.taxonomy.votes, res.taxonomy.votes) and back.geometry.n == res.geometry.n


_KILLED_RUN = """
import time, torch, tl_geometry as tlg
import tl_geometry.run.analysis as analysis_module
from tl_geometry.capture.model_info import describe_model
from tests.tiny import tiny_model, random_tokens
real = analysis_module.stream_layers
def slow(*args, **kwargs):
    time.sleep(0.4)  # slow batches, so that the parent can kill the run in the middle
    return real(*args, **kwargs)
analysis_module.stream_layers = slow
tlg.analyze(tiny_model(4, 2), random_tokens(8, 10, seed=9), (1, 2, 4), repeats=2, batch_size=2, progress=False,
            bootstrap=20, checkpoint={path!r})
"""


def test_sigkilled_run_resumes_from_its_last_checkpoint(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    path = tmp_path / "checkpoint.safetensors"
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_RUN.format(path=str(path))], cwd=root)
    deadline = time.time() + 120
    while not path.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert path.exists(), "the run never wrote a checkpoint"
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        done = fh.get_tensor("window_ids").numel()
    assert 2 <= done < 8  # killed mid-run: at most the batch in flight is lost
    model, tokens = tiny_model(4, 2), random_tokens(8, 10, seed=9)
    options = {"repeats": 2, "batch_size": 2, "progress": False, "bootstrap": 20}
    resumed = tlg.analyze(model, tokens, (1, 2, 4), checkpoint=path, **options)
    whole = tlg.analyze(model, tokens, (1, 2, 4), **options)
    for key, value in whole.geometry.per_sequence.items():
        assert torch.equal(resumed.geometry.per_sequence[key].nan_to_num(-9), value.nan_to_num(-9)), key
    assert torch.equal(resumed.taxonomy.votes, whole.taxonomy.votes)
    other = dict(options, repeats=3)
    try:
        tlg.analyze(model, tokens, (1, 2, 4), checkpoint=path, **other)
    except ValueError as exc:
        assert "other settings" in str(exc)
    else:
        raise AssertionError("a checkpoint of other settings was accepted")


def test_unmeasurable_n_warns_with_the_reason():
    model = tiny_model(4, 2)
    with pytest.warns(UserWarning, match="N = 8, 16: not measurable, windows of 8 tokens give at most 8"):
        res = tlg.analyze(model, random_tokens(2, 8, seed=1), (1, 8, 16), repeats=1, progress=False, bootstrap=10)
    assert res.geometry.mean("f_top")[..., 1:].isnan().all() and not res.geometry.mean("f_top")[..., 0].isnan().any()
    assert "N = 8, 16" in res.geometry.not_measurable()[0]


@pytest.mark.parametrize("factory", ["bridge-gqa", "hooked-gqa"])
def test_a_cache_gives_the_results_of_the_model(factory):
    from ..tiny import MODEL_FACTORIES

    model = MODEL_FACTORIES[factory]()
    tokens = random_tokens(3, 10, seed=4)
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[1, 7:] = 0  # right padding
    options = dict(n=(1, 2, 4), repeats=2, progress=False, bootstrap=20, attention_mask=mask)
    direct = tlg.analyze(model, tokens, **options)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter=tlg.capture.names_filter)
    assert all(tlg.capture.names_filter(name) for name in cache.keys()) and len(cache.keys()) == 2 * model.cfg.n_layers
    for source in (cache, dict(cache.items())):  # an ActivationCache, or a plain dict of hook tensors
        cached = tlg.analyze(source, tokens, **options)
        assert cached.geometry.per_sequence.keys() == direct.geometry.per_sequence.keys()
        for key, value in direct.geometry.per_sequence.items():
            torch.testing.assert_close(cached.geometry.per_sequence[key], value, equal_nan=True, atol=1e-6, rtol=0,
                                       msg=key)
        assert torch.equal(cached.taxonomy.votes, direct.taxonomy.votes)
    assert cached.geometry.settings["model_class"] == "cache"
    with pytest.raises(TLGeometryError, match="the cache holds 3 sequences of 10 positions"):
        tlg.analyze(cache, tokens[:2], progress=False)
    with pytest.raises(TLGeometryError, match="lacks blocks.1.attn.hook_pattern"):
        tlg.analyze({k: v for k, v in cache.items() if not k.startswith("blocks.1.")}, tokens, progress=False)


def test_geometry_under_the_users_own_hooks():
    """Inside an ablation (or any patching hook) the analysis measures the patched run."""
    model = tiny_model(4, 2)
    tokens = random_tokens(2, 10, seed=5)
    clean = tlg.analyze(model, tokens, (1, 2), repeats=1, progress=False, bootstrap=10)
    with tlg.intervene.ablate_heads(model, [(0, 1)], mode="sink"):
        patched = tlg.analyze(model, tokens, (1, 2), repeats=1, progress=False, bootstrap=10)
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=tlg.capture.names_filter)
    assert patched.taxonomy.labels[0, 1] == "mixer" and patched.taxonomy.shares[0, 1, 1] == 1
    assert clean.taxonomy.shares[0, 1, 1] < 1  # the hook, not the model, made it a pure sink head
    # a cache taken under the same hook gives the same numbers
    torch.testing.assert_close(tlg.analyze(cache, tokens, (1, 2), repeats=1, progress=False,
                                           bootstrap=10).geometry.per_sequence["f_top"],
                               patched.geometry.per_sequence["f_top"], equal_nan=True, atol=1e-6, rtol=0)


def test_config_and_keyword_settings_together_are_refused():
    model = tiny_model(4, 2)
    tokens = random_tokens(2, 9, seed=1)
    config = tlg.RunConfig(n=(1, 2), repeats=1, bootstrap=10)
    with pytest.raises(TLGeometryError, match="config= or as keywords, not both: .* n, queries"):
        tlg.analyze(model, tokens, (1, 4), queries="all", config=config, progress=False)
    # the defaults beside config are no setting: config alone decides
    assert tlg.analyze(model, tokens, config=config, progress=False).geometry.n == (1, 2)


@pytest.mark.parametrize("style,dtype", [(style, torch.float32) for style in WINDOW_STYLES]
                         + [("gemma3", torch.bfloat16), ("hooked", torch.bfloat16)])
def test_sliding_window_layers_are_measured_over_the_sources_their_queries_see(style, dtype):
    """Every configuration style, both model classes, GQA, left padding: each layer's F equals the
    oracle over the visible sources (t − 3 .. t in the local layers), the random baseline at N = 1 is
    exactly 1, and rows that no longer see the sink have no sink statistics and vote without it."""
    layers = ("global", "local", "local") if style == "qwen2" else ("local", "global", "local")
    model = tiny_windowed(style, layers, window=4).to(dtype)
    windows = {layer: 4 for layer, kind in enumerate(layers) if kind == "local" or style == "mistral"}
    assert describe_model(model).sliding_windows == windows
    # no token repeats in a window, nor BOS (ids 1-3 are special): a repeated token's equal values
    # under weights closer than float32 resolves are coinciding contributions (docs/metrics.md)
    tokens = torch.stack([torch.randperm(D_VOCAB - 4, generator=torch.Generator().manual_seed(row))[:11] + 4
                          for row in range(2)])
    mask = torch.ones_like(tokens)
    mask[1, :3] = 0  # the second window left-padded: it starts at position 3
    tokens[0, 0] = tokens[1, 3] = model.tokenizer.bos_token_id
    ns = (1, 2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn: every window starts with BOS, every window is declared
        warnings.filterwarnings("ignore", message=FEW_VOTES_WARNING)
        res = tlg.analyze(model, tokens, ns, attention_mask=mask, queries="all", repeats=2, progress=False,
                          bootstrap=10)
    assert res.geometry.windows_without_bos == []
    seen = {}
    tlg.capture.stream_layers(model, tokens, lambda layer, att: seen.setdefault(layer, att), attention_mask=mask)
    for layer, att in seen.items():
        assert att.window == windows.get(layer)
        ref = oracle_separability(att.pattern, att.kv_values, ns, key_mask=att.key_mask, query_mask=att.query_mask,
                                  window=windows.get(layer))
        torch.testing.assert_close(res.geometry.per_sequence["f_top"][:, layer], ref["f"].nanmean(2).float(),
                                   atol=1e-6, rtol=0, equal_nan=True)
        random_n1 = res.geometry.per_sequence["f_random"][:, layer, :, 0]
        # the selected point is the aggregate, and no unseen key ties it
        assert bool((random_n1 == 1).all())
        # voting rows t ≥ 4 (11 and 8 real tokens: 7 + 4 rows) see no sink in a windowed layer
        assert res.taxonomy.sinkless[layer].tolist() == [11 if layer in windows else 0] * 4
    table = res.heads_table(all_columns=True)  # share_sinkless: every column
    sinkless = table.set_index("name")["share_sinkless"]  # the label's basis: 11 of each windowed head's 17 votes
    assert sinkless["L2H0"] == 11 / 17 and sinkless["L1H0"] == (11 / 17 if 1 in windows else 0)
    assert table.attrs["bos"] == "every window starts with BOS" and table.attrs["windows_without_bos"] == []
    from tl_geometry.present.report import attention_notes

    notes = attention_notes(res)
    assert notes[0].startswith("Every window starts with BOS") and "sliding window of 4 positions" in notes[1]
    with_sink = tlg.separability(seen[0].pattern, seen[0].kv_values, 1, **seen[0].visibility)
    undefined = torch.isnan(with_sink.f[1, :, :, 0])  # left-aligned: 8 real tokens, then the pads
    assert bool(undefined[:, [0, 8, 9, 10]].all()) and not bool(undefined[:, 1:8].any())  # query 0 has one source


def test_few_votes_are_warned_once_with_their_count():
    model = tiny_model(4, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = tlg.analyze(model, random_tokens(1, 15, seed=3), (1, 2), repeats=1, bootstrap=5, progress=False)
    few = [str(w.message) for w in caught if "votes per head" in str(w.message)]
    uncertain = int(res.taxonomy.label_uncertain.sum())
    assert few == [f"the regime labels rest on as few as 14 votes per head (one per taxonomy query of each window); "
                   f"{uncertain} of 12 labels could flip within their 95% interval (heads_table()'s label_uncertain). "
                   "Analyse more text, ≥ 100 votes per head, for firmer labels."]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 2 windows × 50 votes: enough
        tlg.analyze(model, random_tokens(2, 51, seed=3), (1, 2), repeats=1, bootstrap=5, progress=False)


@pytest.mark.slow
def test_bfloat16_matmuls_on_gemma_3_certify_nothing_above_the_measurement():
    # Gemma 3's d_head = 256: at "medium" (u = 2⁻⁸) Lemma 3's rounding model breaks (m·u ≥ 1), so
    # every certificate is the trivial one, N/(t + 1) and 0, never above the measurement
    model = tlg.load_model("gemma-3-270m")
    tokens = torch.randint(10, 1000, (2, 48), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = model.tokenizer.bos_token_id
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        res = tlg.analyze(model, tokens, (1, 2, 8), queries="all", repeats=1, bootstrap=10, progress=False,
                          head_types=False)
    finally:
        torch.set_float32_matmul_precision(before)
    seq = res.geometry.per_sequence
    assert (seq["recall_bound"] == 0).all()
    for j, n in enumerate((1, 2, 8)):
        trivial = torch.tensor([n / (t + 1) for t in range(n, 48)]).mean()
        torch.testing.assert_close(seq["precision_bound"][..., j], trivial.expand_as(seq["precision_bound"][..., j]),
                                   rtol=0, atol=1e-6)
        assert (seq["precision_bound"][..., j] <= seq["precision_top"][..., j] + 1e-6).all()
