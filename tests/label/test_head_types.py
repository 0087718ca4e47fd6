"""TransformerLens's head-type scores beside the regimes (tl_geometry.label.head_types)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tl_geometry as tlg
from tl_geometry.errors import TLGeometryError
from tl_geometry.label.head_types import HEAD_TYPES, HeadTypes, _scores, head_types, repeated_random_tokens
from tl_geometry.label.taxonomy import HeadTaxonomy

from ..tiny import random_tokens


def test_repeated_random_tokens_are_bos_then_one_draw_twice(tiny_model):
    tokens = repeated_random_tokens(tiny_model, length=12, seed=3)
    assert tokens.shape == (1, 25)
    assert torch.equal(tokens[0, 1:13], tokens[0, 13:])
    assert torch.equal(tokens, repeated_random_tokens(tiny_model, length=12, seed=3))
    assert not torch.equal(tokens, repeated_random_tokens(tiny_model, length=12, seed=4))
    with pytest.raises(TLGeometryError, match="length must be an int"):
        repeated_random_tokens(tiny_model, length=1)
    with pytest.raises(TLGeometryError, match="context"):
        repeated_random_tokens(tiny_model, length=40)  # 81 tokens > n_ctx 64


def test_scores_equal_transformer_lens_per_head_scores(tiny_model):
    """The vectorised sums against TransformerLens's own per-head function, head by head."""
    from transformer_lens.head_detector import compute_head_attention_similarity_score

    types = head_types(tiny_model, length=15, seed=1)
    tokens = repeated_random_tokens(tiny_model, length=15, seed=1)
    _, cache = tiny_model.run_with_cache(tokens)
    from tl_geometry.label.head_types import _detection_patterns

    patterns = _detection_patterns(tokens).float()
    for layer in range(types.shape[0]):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"][0]
        for head in range(types.shape[1]):
            for i, kind in enumerate(HEAD_TYPES):
                expected = compute_head_attention_similarity_score(
                    pattern[head], patterns[i], exclude_bos=False, exclude_current_token=False, error_measure="mul")
                assert float(getattr(types, kind)[layer, head]) == pytest.approx(expected, abs=1e-6)
    # the best a head can reach: previous-token marks every row but BOS's, the others the rows whose
    # token occurred before (the whole second copy, and repeats within a draw of a 50-token vocabulary)
    ids = tokens[0].tolist()
    repeated = sum(ids[q] in ids[:q] for q in range(len(ids))) / len(ids)
    assert repeated >= 15 / 31
    assert types.settings["ceiling"] == pytest.approx({"previous_token": 30 / 31, "duplicate_token": repeated,
                                                      "induction": repeated})


def _types(prev, dup, ind, length=50):
    ceiling = {"previous_token": 2 * length / (2 * length + 1), "duplicate_token": length / (2 * length + 1),
               "induction": length / (2 * length + 1)}
    as_tensor = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    return HeadTypes(as_tensor(prev), as_tensor(dup), as_tensor(ind), settings={"length": length, "ceiling": ceiling})


def test_labels_are_the_best_share_of_a_types_ceiling_at_least_the_threshold():
    half = 50 / 101
    types = _types([[0.99, 0.2, 0.1]], [[0.0, 0.3, 0.0]], [[0.0, 0.0, half / 2 - 1e-9]])
    # 0.99 of 100/101 for previous-token; duplicate 0.3 of 50/101 (0.61) beats previous 0.2 (0.20);
    # induction just below half of its ceiling: no type
    assert types.labels().tolist() == [["previous_token", "duplicate_token", "other"]]
    assert types.labels(threshold=0.25).tolist()[0][2] == "induction"


def test_crosstab_counts_every_head_once():
    types = _types([[0.99, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]], [[0.0, 0.4], [0.0, 0.0]])
    # votes (current, sink, other) → mixer, retriever, reset, mixer
    votes = torch.tensor([[[0, 5, 0], [9, 0, 0]], [[0, 0, 4], [0, 7, 0]]])
    table = types.crosstab(HeadTaxonomy(votes))
    assert table.loc["All", "All"] == 4 and table.loc["mixer", "All"] == 2
    assert table.loc["mixer", "previous_token"] == 1 and table.loc["retriever", "induction"] == 1
    assert table.loc["reset", "other"] == 1 and table.loc["mixer", "other"] == 1
    with pytest.raises(TLGeometryError, match="one model"):
        types.crosstab(HeadTaxonomy(votes[:1]))


@pytest.mark.ill_typed  # passes a dict where HeadTypes belongs, to see the one-line error
def test_attached_head_types_join_the_table_profile_and_saved_run(tiny_model, tmp_path):
    res = tlg.analyze(tiny_model, random_tokens(2, 12), n=(1, 2), progress=False, head_types=False)
    types = head_types(tiny_model, length=10)
    with pytest.raises(TLGeometryError, match="with_head_types takes"):
        res.with_head_types({"induction": 1})
    with pytest.raises(TLGeometryError, match="do not fit"):
        res.with_head_types(HeadTypes(*(getattr(types, k)[:1] for k in HEAD_TYPES)))
    assert res.head_types is None and "induction" not in res.heads_table(all_columns=True).columns
    typed = res.with_head_types(types)
    table = typed.heads_table(all_columns=True)
    for kind in HEAD_TYPES:
        assert np.array_equal(table[kind].to_numpy(), getattr(types, kind).reshape(-1).numpy())
    assert table["head_type"].tolist() == types.labels().reshape(-1).tolist()
    # one head in each convention, and a subset in the order asked
    assert typed.heads_table(["L1H2", (0, 3), 5])["name"].tolist() == ["L1H2", "L0H3", "L1H1"]
    assert typed.head_profile("L1H2") == typed.head_profile((1, 2)) == typed.head_profile(6)
    assert "previous-token" in typed.head_profile("L1H2") and "head_types=HeadTypes(" in repr(typed)
    with pytest.raises(TLGeometryError, match="one head"):
        typed.head_profile([1, 2])

    typed.save(tmp_path)
    loaded = tlg.Analysis.load(tmp_path)
    assert torch.equal(loaded.head_types.induction, types.induction)
    assert loaded.head_types.settings == types.settings
    assert torch.equal(loaded.head_types.tokens, types.tokens)
    assert torch.equal(types.tokens, repeated_random_tokens(tiny_model, length=10))
    res.save(tmp_path, overwrite=True)  # an analysis without scores leaves none of the other's behind
    assert tlg.Analysis.load(tmp_path).head_types is None


def test_analyze_attaches_the_head_types_of_its_model(tiny_model):
    tokens = random_tokens(2, 12)
    res = tlg.analyze(tiny_model, tokens, n=(1, 2), progress=False)
    # the tiny context (64) holds BOS + 2 × 31: "auto" takes what fits
    expected = head_types(tiny_model, length=31)
    assert res.head_types.settings == expected.settings and res.head_types.settings["length"] == 31
    for kind in HEAD_TYPES:
        assert torch.equal(getattr(res.head_types, kind), getattr(expected, kind))
    assert "head_type" in res.heads_table().columns
    _, cache = tiny_model.run_with_cache(tokens, names_filter=tlg.capture.names_filter)
    from_cache = tlg.analyze(cache, tokens, n=(1, 2), progress=False)
    assert from_cache.head_types is None  # a cache cannot run the forward; print(res) says how to add them
    assert "res.with_head_types(tlg.head_types(model))" in repr(from_cache)


@pytest.mark.ill_typed  # float ids and a batch of two, to see the one-line error
def test_given_tokens_are_scored_as_they_are(tiny_model):
    tokens = random_tokens(1, 20, seed=5)
    types = head_types(tiny_model, tokens=tokens)
    ours, _ = _scores(tiny_model, tokens)
    assert torch.equal(types.scores(), ours) and torch.equal(types.tokens, tokens)
    assert types.settings["n_tokens"] == 20 and "20 given tokens" in repr(types)
    assert torch.equal(head_types(tiny_model, tokens=tokens[0]).tokens, tokens)  # [pos] is one sequence
    for bad in (random_tokens(2, 20), tokens.float(), tokens[:, :1]):
        with pytest.raises(TLGeometryError, match=r"head_types' tokens must be the ids of one sequence"):
            head_types(tiny_model, tokens=bad)
    with pytest.raises(TLGeometryError, match="context"):
        head_types(tiny_model, tokens=random_tokens(1, 80))


@pytest.mark.slow
def test_head_types_equal_detect_head_on_smollm2(smollm2):
    """The bundled model, through the whole of TransformerLens's own detect_head, on a text: the
    cross-check docs/metrics.md gives ("Familiar head types")."""
    from transformer_lens.head_detector import detect_head

    text = "The cat sat on the mat. The cat sat on the mat again."
    ours = head_types(smollm2, tokens=smollm2.to_tokens(text))
    for kind in HEAD_TYPES:
        torch.testing.assert_close(getattr(ours, kind), detect_head(smollm2, text, f"{kind}_head").double(),
                                   atol=1e-6, rtol=0)
    # the random sequence's ids, decoded to text, do not tokenise back to themselves
    types = head_types(smollm2)
    assert smollm2.to_tokens(smollm2.tokenizer.decode(types.tokens[0, 1:])).shape[1] != types.tokens.shape[1]
