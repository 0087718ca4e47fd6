"""The one-pass notebook entry point: equals the separate passes, texts in, save/load, tables."""

from __future__ import annotations

import warnings

import pytest
import torch

import tl_geometry as tlg
import tl_geometry.run.inputs as inputs_module
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


@pytest.mark.slow
def test_texts_are_tokenised_with_bos_and_right_padding(smollm2):
    texts = ["The cat sat on the mat.", "Paris is the capital of France, a country in Europe."]
    tokens, mask = tlg.tokenize_texts(smollm2, texts)
    assert (tokens[:, 0] == smollm2.tokenizer.bos_token_id).all() and mask[0].sum() < mask[1].sum()
    res = tlg.analyze(smollm2, texts, (1, 2, 4), repeats=2, progress=False, bootstrap=20)
    assert res.taxonomy.labels.shape == (30, 9) and res.geometry.settings["n_windows"] == 2
    n_votes = (mask[:, 1:].sum()).item()  # every real query but position 0, per head
    assert (res.taxonomy.votes.sum(-1) == n_votes).all()


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


@pytest.mark.ill_typed
def test_bad_input_to_analyze_is_one_clear_error(tmp_path):
    model = tiny_model(4, 2)  # n_ctx 64
    tokens = random_tokens(2, 9, seed=1)
    cases = [
        (dict(tokens_or_texts=tokens, batch_size=0), "batch_size must be an int ≥ 1"),
        (dict(tokens_or_texts=random_tokens(1, 65)), "65 tokens per sequence exceed .* context of 64"),
        (dict(tokens_or_texts=tokens.float()), "token ids must be integers"),
        (dict(tokens_or_texts=tokens, attention_mask=torch.tensor([[1] * 9, [0] * 9])), r"rows \[1\] have no real token"),
        (dict(tokens_or_texts=tokens, n=(9, 16)), "no N in \\[9, 16\\] is measurable"),
        (dict(tokens_or_texts=tokens[:0]), "at least one window"),
        (dict(tokens_or_texts=tokens.clamp_max(0) - 1), r"token ids must lie in 0\.\.\d+ .* from -1 to -1"),
        (dict(tokens_or_texts=tokens + model.cfg.d_vocab), "token ids must lie in 0"),
        (dict(tokens_or_texts=tokens, n=2.5), "n must be integers ≥ 1"),
        (dict(tokens_or_texts=tokens, checkpoint=tmp_path), "is a folder: pass a file path"),
        (dict(tokens_or_texts=tokens, checkpoint=tmp_path / "absent" / "c.safetensors"), "does not exist or is not"),
    ]
    for kwargs, message in cases:
        with pytest.raises(TLGeometryError, match=message):
            tlg.analyze(model, progress=False, bootstrap=10, **kwargs)
    damaged = tmp_path / "checkpoint.safetensors"
    damaged.write_bytes(b"not a checkpoint")
    with pytest.raises(TLGeometryError, match="cannot resume from the checkpoint .*damaged.*delete it to start again"):
        tlg.analyze(model, tokens, (1, 2), progress=False, bootstrap=10, checkpoint=damaged)
    assert damaged.read_bytes() == b"not a checkpoint"


def test_numpy_token_ids_equal_torch_token_ids():
    model = tiny_model(4, 2)
    tokens = random_tokens(2, 9, seed=1)
    a = tlg.analyze(model, tokens, (1, 2), repeats=1, progress=False, bootstrap=10)
    b = tlg.analyze(model, tokens.numpy(), (1, 2), repeats=1, progress=False, bootstrap=10)
    torch.testing.assert_close(a.geometry.per_sequence["f_top"], b.geometry.per_sequence["f_top"], equal_nan=True)


def test_unmeasurable_n_warns_with_the_reason():
    model = tiny_model(4, 2)
    with pytest.warns(UserWarning, match="N = 8, 16: not measurable, windows of 8 tokens give at most 8"):
        res = tlg.analyze(model, random_tokens(2, 8, seed=1), (1, 8, 16), repeats=1, progress=False, bootstrap=10)
    assert res.geometry.mean("f_top")[..., 1:].isnan().all() and not res.geometry.mean("f_top")[..., 0].isnan().any()
    assert "N = 8, 16" in res.geometry.not_measurable()[0]


def test_the_model_is_described_once_per_analysis(monkeypatch):
    import tl_geometry.capture.adapters as adapters
    import tl_geometry.run.inputs as inputs_module

    calls = []
    real = adapters.describe_model

    def counting(model):
        calls.append(1)
        return real(model)

    monkeypatch.setattr(inputs_module, "describe_model", counting)
    monkeypatch.setattr(adapters, "describe_model", counting)
    tlg.analyze(tiny_model(4, 2), random_tokens(6, 9, seed=1), (1, 2), repeats=1, batch_size=2, progress=False,
                bootstrap=10, head_types=False)  # the head types' own forward describes the model again
    assert len(calls) == 1  # three batches


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


def test_right_padded_tokens_without_a_mask_warn_with_the_fix(monkeypatch):
    model = tiny_model(4, 2)
    monkeypatch.setattr(inputs_module, "pad_token_id", lambda model: 7)  # the tiny models have no tokenizer
    tokens = random_tokens(3, 9, seed=4)
    tokens[tokens == 7] = 8
    tokens[1, -3:] = 7  # one row right-padded, as model.to_tokens pads a shorter text
    with pytest.warns(UserWarning, match=r"1 of 3 windows end in the pad token id 7 .* Pass attention_mask="):
        tlg.analyze(model, tokens, 1, repeats=0, bootstrap=1, progress=False)
    mask = (tokens != 7).long()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=FEW_VOTES_WARNING)
        tlg.analyze(model, tokens, 1, attention_mask=mask, repeats=0, bootstrap=1, progress=False)
    # the same batch's cache (an ActivationCache keeps its model, so its pad id is known)
    _, cache = model.run_with_cache(tokens, names_filter=tlg.capture.names_filter)
    with pytest.warns(UserWarning, match=r"1 of 3 windows end in the pad token id 7 .* to run_with_cache"):
        tlg.analyze(cache, tokens, 1, repeats=0, bootstrap=1, progress=False)
    _, cache = model.run_with_cache(tokens, names_filter=tlg.capture.names_filter, attention_mask=mask)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=FEW_VOTES_WARNING)
        tlg.analyze(cache, tokens, 1, attention_mask=mask, repeats=0, bootstrap=1, progress=False)


def test_a_cache_without_its_batch_axis_is_one_sequence(tiny_model):
    tokens = random_tokens(1, 9, seed=3)
    _, batched = tiny_model.run_with_cache(tokens, names_filter=tlg.capture.names_filter)
    _, single = tiny_model.run_with_cache(tokens, names_filter=tlg.capture.names_filter, remove_batch_dim=True)
    expected = tlg.analyze(batched, tokens, (1, 2), repeats=1, bootstrap=5, progress=False)
    for given in (tokens[0], tokens, None):
        got = tlg.analyze(single, given, (1, 2), repeats=1, bootstrap=5, progress=False)
        for key, value in expected.geometry.per_sequence.items():
            torch.testing.assert_close(got.geometry.per_sequence[key], value, equal_nan=True, rtol=0, atol=0)
        assert torch.equal(got.taxonomy.votes, expected.taxonomy.votes)
    att = tlg.capture.read_layer(single, 1)
    assert att.pattern.shape[0] == 1 and torch.equal(att.pattern, tlg.capture.read_layer(batched, 1).pattern)


@pytest.mark.slow
def test_string_tokens_are_refused_as_texts(smollm2):
    with pytest.raises(TLGeometryError, match=r"string tokens \(model\.to_str_tokens output\)"):
        tlg.analyze(smollm2, smollm2.to_str_tokens("The cat sat on the mat."), progress=False)
    with pytest.raises(TLGeometryError, match="string tokens"):
        tlg.analyze(smollm2, [" cat", " sat", " on"], progress=False)


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
    table = res.heads_table()
    sinkless = table.set_index("name")["share_sinkless"]  # the label's basis: 11 of each windowed head's 17 votes
    assert sinkless["L2H0"] == 11 / 17 and sinkless["L1H0"] == (11 / 17 if 1 in windows else 0)
    assert table.attrs["bos"] == "every window starts with BOS" and table.attrs["windows_without_bos"] == []
    from tl_geometry.present.report import attention_notes

    notes = attention_notes(res)
    assert notes[0].startswith("Every window starts with BOS") and "sliding window of 4 positions" in notes[1]
    with_sink = tlg.separability(seen[0].pattern, seen[0].kv_values, 1, **seen[0].visibility)
    undefined = torch.isnan(with_sink.f[1, :, :, 0])  # left-aligned: 8 real tokens, then the pads
    assert bool(undefined[:, [0, 8, 9, 10]].all()) and not bool(undefined[:, 1:8].any())  # query 0 has one source


def test_windows_without_bos_are_recorded_and_told(tmp_path):
    model = tiny_windowed("gemma3")
    tokens = random_tokens(3, 9, seed=2)
    tokens[tokens == model.tokenizer.bos_token_id] = 5
    tokens[1, 0] = model.tokenizer.bos_token_id  # only window 1 starts with BOS
    with pytest.warns(UserWarning, match=r"2 of 3 windows do not start with the BOS token \(id 1; windows \[0, 2\]\)"
                                         r".*Prepend BOS"):
        res = tlg.analyze(model, tokens, (1, 2), progress=False, bootstrap=10)
    assert res.geometry.windows_without_bos == [0, 2] and "2 windows without BOS" in repr(res)
    res.save(tmp_path / "run")
    assert tlg.Analysis.load(tmp_path / "run").geometry.windows_without_bos == [0, 2]
    first, second = (tlg.analyze(model, tokens[rows], (1, 2), window_ids=torch.tensor(ids), progress=False,
                                 bootstrap=10) for rows, ids in ((slice(0, 2), [0, 1]), (slice(2, 3), [2])))
    assert first.merge(second).geometry.windows_without_bos == [0, 2]
    _, cache = model.run_with_cache(tokens, names_filter=tlg.capture.names_filter)
    with pytest.warns(UserWarning, match=r"cannot tell whether the cached windows start with BOS .* tlg.analyze\(cache, "
                                         r"tokens\)"):
        unknown = tlg.analyze(cache, n=(1, 2), progress=False, bootstrap=10)
    assert unknown.geometry.windows_without_bos is None and "BOS unknown" in repr(unknown)


def test_extra_columns_join_by_head_and_regime_means_equal_a_groupby():
    res = tlg.analyze(tiny_model(4, 2), random_tokens(3, 10, seed=5), (1, 2), repeats=1, bootstrap=5, progress=False)
    layers, heads = res.taxonomy.shape
    patch = torch.arange(layers * heads, dtype=torch.float32).reshape(layers, heads) * 0.5 - 1
    patch[0, 1] = float("nan")
    chosen = ["L2H1", (0, 3), 4, "L1H0"]  # a subset, in an order of its own
    table = res.heads_table(heads=chosen, extra={"patch": patch, "flat": patch.flatten().numpy()})
    expected = [float(patch[layer, head]) for layer, head in zip(table["layer"], table["head"], strict=True)]
    assert table["name"].tolist() == ["L2H1", "L0H3", "L1H0", "L1H0"]
    assert torch.equal(torch.tensor(table["patch"].to_numpy()), torch.tensor(expected, dtype=torch.float64))
    assert table["flat"].equals(table["patch"])
    full = res.heads_table(extra={"patch": patch})
    grouped = full.groupby("regime")["patch"].agg(["count", "mean", "sum"])
    means = res.regime_means(patch)
    for regime in means.index:
        if regime in grouped.index:
            assert means.loc[regime].tolist() == pytest.approx(grouped.loc[regime].tolist(), nan_ok=True)
        else:  # no head of this regime: nothing counted
            assert means.loc[regime, "count"] == 0 and means.loc[regime, "sum"] == 0
    assert means["count"].sum() == layers * heads - 1  # the NaN head is skipped
    for bad, message in ((torch.zeros(heads, layers), r"\[n_layers, n_heads\] = \[3, 4\]"),
                         (torch.zeros(layers * heads + 1), "got shape"), (torch.ones(layers, heads).bool(), "booleans")):
        with pytest.raises(TLGeometryError, match=message):
            res.heads_table(extra={"x": bad})
        with pytest.raises(TLGeometryError, match=message):
            res.regime_means(bad)
    with pytest.raises(TLGeometryError, match="one of the table's own"):
        res.heads_table(extra={"regime": patch})


def test_dominant_offset_is_missing_where_a_head_has_no_other_vote():
    from tl_geometry.label.taxonomy import HeadTaxonomy

    res = tlg.analyze(tiny_model(4, 2), random_tokens(2, 8, seed=1), (1, 2), repeats=1, bootstrap=5, progress=False)
    offsets = torch.zeros_like(res.taxonomy.offsets)
    offsets[0, 0, 2] = 3  # one head with `other` votes two tokens back; none elsewhere
    tax = HeadTaxonomy(res.taxonomy.votes, offsets, res.taxonomy.settings, res.taxonomy.sinkless)
    column = tlg.Analysis(res.geometry, tax).heads_table()["dominant_offset"]
    assert str(column.dtype) == "Int64" and column.iloc[0] == 2 and column.iloc[1:].isna().all()


def test_columns_fixed_by_the_definition_only_on_request():
    """Euclidean N = 1: F of the aggregate itself is 1 (the gap 0) unless contributions coincide;
    cosine runs keep their N = 1 columns, which are measured."""
    from tl_geometry.run.results import FIXED_AT_ONE

    model, tokens = tiny_model(4, 2), random_tokens(2, 10, seed=2)
    res = tlg.analyze(model, tokens, (1, 2), repeats=2, bootstrap=5, progress=False)
    default, full = res.heads_table(), res.heads_table(all_columns=True)
    fixed = sorted(set(full.columns) - set(default.columns))
    assert fixed == sorted(f"{metric}@1" for metric in FIXED_AT_ONE)
    for column in ("f_top@1", "f_random@1", "f_nosink@1"):
        assert (full[column] == 1).all(), column
    assert (full["gap@1"] == 0).all() and {"f_top@2", "align_sink@1"} <= set(default.columns)
    cosine = tlg.analyze(model, tokens, (1, 2), distance="cosine", repeats=2, bootstrap=5, progress=False)
    assert list(cosine.heads_table().columns) == list(cosine.heads_table(all_columns=True).columns)


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
