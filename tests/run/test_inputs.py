"""The windows a run measures (run/inputs.py): token ids or texts, masks, caches, BOS and padding checked and warned about once."""

from __future__ import annotations

import warnings

import pytest
import torch

import tl_geometry as tlg
import tl_geometry.run.inputs as inputs_module
from tl_geometry.errors import TLGeometryError

from ..inputs import FEW_VOTES_WARNING
from ..tiny import random_tokens, tiny_model, tiny_windowed


@pytest.mark.slow
def test_texts_are_tokenised_with_bos_and_right_padding(smollm2):
    texts = ["The cat sat on the mat.", "Paris is the capital of France, a country in Europe."]
    tokens, mask = tlg.tokenize_texts(smollm2, texts)
    assert (tokens[:, 0] == smollm2.tokenizer.bos_token_id).all() and mask[0].sum() < mask[1].sum()
    res = tlg.analyze(smollm2, texts, (1, 2, 4), repeats=2, progress=False, bootstrap=20)
    assert res.taxonomy.labels.shape == (30, 9) and res.geometry.settings["n_windows"] == 2
    n_votes = (mask[:, 1:].sum()).item()  # every real query but position 0, per head
    assert (res.taxonomy.votes.sum(-1) == n_votes).all()


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


def test_left_padded_tokens_without_a_mask_warn_as_padding(monkeypatch):
    model = tiny_model(4, 2)
    monkeypatch.setattr(inputs_module, "pad_token_id", lambda model: 7)
    tokens = random_tokens(3, 9, seed=4)
    tokens[tokens == 7] = 8
    tokens[1, :3] = 7  # one row left-padded
    with pytest.warns(UserWarning, match=r"1 of 3 windows start with the pad token id 7 .* Pass attention_mask="):
        tlg.analyze(model, tokens, 1, repeats=0, bootstrap=1, progress=False)


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


def test_meta_tensors_are_refused_in_one_line():
    import tl_geometry as tlg

    from ..tiny import random_tokens, tiny_model

    tokens = random_tokens(2, 6, seed=1)
    with pytest.raises(TLGeometryError, match="the model's weights are on the meta device"):
        tlg.analyze(tiny_model(4, 2).to("meta"), tokens, 1, repeats=1, progress=False)
    with pytest.raises(TLGeometryError, match="the tokens are on the meta device"):
        tlg.analyze(tiny_model(4, 2), tokens.to("meta"), 1, repeats=1, progress=False)
