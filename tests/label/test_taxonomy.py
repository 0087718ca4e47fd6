"""Head taxonomy: hand-built patterns with labels fixed by the rule, loop oracle, GQA, padding, merging."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tl_geometry.label.taxonomy import HeadTaxonomy
from tl_geometry.measure.votes import offset_counts, vote_counts, winner_sources


def _taxonomy(pattern, v, **kw):
    return HeadTaxonomy.from_votes(vote_counts(pattern, v, **kw).sum(0, keepdim=True))


def test_identity_is_retriever():
    pattern = torch.eye(6)[None, None]
    assert _taxonomy(pattern, torch.ones(1, 6, 1, 3)).labels.tolist() == [["retriever"]]


def test_all_mass_on_a_large_sink_is_mixer():
    pattern = torch.zeros(1, 1, 6, 6)
    pattern[..., 0] = 1.0
    v = torch.ones(1, 6, 1, 3)
    v[:, 0] *= 5
    tax = _taxonomy(pattern, v)
    assert tax.labels.tolist() == [["mixer"]] and tax.shares[0, 0].tolist() == [0.0, 1.0, 0.0]


def test_previous_token_is_reset_with_offset_one():
    pattern = torch.zeros(1, 1, 6, 6)
    pattern[0, 0, 0, 0] = 1
    pattern[0, 0, torch.arange(1, 6), torch.arange(0, 5)] = 1
    pattern[0, 0, 1] = torch.tensor([0.4, 0.6, 0, 0, 0, 0])  # query 1: the previous token is the sink
    v = torch.ones(1, 6, 1, 2)
    winners = winner_sources(pattern, v)
    assert winners.tolist() == [[[-1, 1, 1, 2, 3, 4]]]
    tax = HeadTaxonomy.from_votes(vote_counts(pattern, v), offset_counts(winners, torch.arange(6)[None], 6))
    assert tax.labels.tolist() == [["reset"]] and tax.dominant_offset.tolist() == [[1]]


def test_exact_vote_ties_are_reset():
    # queries 1, 2 vote current; 3, 4 vote sink: a tie between two regimes
    pattern = torch.zeros(1, 1, 5, 5)
    pattern[0, 0, 0, 0] = pattern[0, 0, 1, 1] = pattern[0, 0, 2, 2] = 1
    pattern[0, 0, 3, 0] = pattern[0, 0, 4, 0] = 1
    tax = _taxonomy(pattern, torch.ones(1, 5, 1, 2))
    assert tax.votes.tolist() == [[[2, 2, 0]]] and tax.labels.tolist() == [["reset"]]
    assert HeadTaxonomy.from_votes(torch.zeros(1, 1, 3)).labels.tolist() == [["reset"]]  # no votes at all


def test_agreement_kappa_and_io(tmp_path):
    votes = torch.tensor([[[5, 1, 1], [0, 9, 2], [1, 1, 7]], [[3, 3, 0], [8, 0, 1], [0, 4, 1]]])
    tax = HeadTaxonomy.from_votes(votes, torch.randint(0, 5, (2, 3, 6)), {"model": "x"})
    assert tax.agreement(tax) == {"agreement": 1.0, "kappa": 1.0}
    flipped = HeadTaxonomy.from_votes(votes.flip(-1))
    stats = tax.agreement(flipped)
    a, b = tax.label_ids.flatten(), flipped.label_ids.flatten()
    p_o = (a == b).float().mean().item()
    p_e = sum((a == k).float().mean().item() * (b == k).float().mean().item() for k in range(3))
    assert stats["agreement"] == pytest.approx(p_o) and stats["kappa"] == pytest.approx((p_o - p_e) / (1 - p_e))
    assert tax.heads("mixer") == [(0, 1), (1, 2)] and tax.heads("reset") == [(0, 2), (1, 0)]
    tax.save(tmp_path / "t.safetensors")
    back = HeadTaxonomy.load(tmp_path / "t.safetensors")
    assert torch.equal(back.votes, tax.votes) and torch.equal(back.offsets, tax.offsets) and back.settings == {"model": "x"}
    frame = tax.to_dataframe()
    assert set(frame.columns) == {"layer", "head", "name", "regime", "metric", "value"}
    fractions = tax.fractions()
    assert fractions.iloc[-1]["layer"] == "all" and (fractions[["retriever", "mixer", "reset"]].sum(axis=1) - 1).abs().max() < 1e-12
    merged = tax.merge(tax)
    assert torch.equal(merged.votes, 2 * tax.votes) and (merged.labels == tax.labels).all()


def test_print_of_a_result_is_a_line_per_part():
    import tl_geometry as tlg

    from ..tiny import random_tokens, tiny_model

    res = tlg.analyze(tiny_model(4, 2), random_tokens(3, 8), (1, 2), repeats=1, bootstrap=5, progress=False)
    text = repr(res)  # geometry, taxonomy and head types: a line each
    assert len(text.splitlines()) == 4 and len(text) < 700
    assert "HeadTaxonomy(3 layers × 4 heads" in text and "retriever" in text and "GeometryResult(3 windows" in text
    assert "head_types=HeadTypes(3×4 heads on BOS + 2 × 31 repeated random tokens" in text
    comparison = tlg.compare(res, res)
    assert repr(comparison).startswith("Comparison(") and "agreement 100.0%" in repr(comparison)


def test_each_label_says_its_votes_interval_and_whether_it_could_flip():
    # the L23H3: mixer on 8 votes against 6 (15 tokens); a clear head; a tie; no votes
    votes = torch.tensor([[[6, 8, 0], [40, 0, 0], [5, 5, 0], [0, 0, 0]]])
    tax = HeadTaxonomy(votes)
    assert tax.n_votes.tolist() == [[14, 40, 10, 0]]
    low, high = tax.share_interval
    z = 1.959963984540054
    for head, (wins, n) in enumerate([(8, 14), (40, 40), (5, 10)]):
        # the Wilson interval is where (p̂ − p)² = z² p (1 − p) / n: the roots of a quadratic in p
        p_hat = wins / n
        roots = sorted(np.roots([1 + z * z / n, -(2 * p_hat + z * z / n), p_hat * p_hat]).real)
        assert (float(low[0, head]), float(high[0, head])) == pytest.approx(roots, abs=1e-12)
    assert torch.isnan(low[0, 3]) and torch.isnan(high[0, 3])
    assert tax.label_uncertain.tolist() == [[True, False, True, True]]
    assert "0–40 votes per head from the analysed windows, 3 labels within the 95% interval of the runner-up" in repr(tax)


def test_labels_are_said_with_their_meaning_and_the_surest_heads_come_first():
    from tl_geometry.label.taxonomy import REGIME_MEANING, regime_gloss

    votes = torch.tensor([[[300, 0, 0], [1, 2, 2], [5, 90, 5], [0, 0, 0], [60, 30, 10], [0, 9, 1]]])
    settings = {"n_windows": 8, "seq_len": 256, "corpus": "python-reference", "queries": "last"}
    tax = HeadTaxonomy.from_votes(votes, settings=settings)
    assert regime_gloss("mixer") == "mixer: the sink wins"
    assert regime_gloss("reset", familiar=True) == "reset: another token wins (previous-token heads)"
    assert regime_gloss("retriever", familiar=True) == "retriever: the current token wins"  # no familiar type
    assert tax.describe_head(0, 2) == "L0H2, a mixer: the sink wins 90% of its 100 queries"
    assert tax.describe_head(0, 0) == "L0H0, a retriever: the current token wins 100% of its 300 queries"
    assert tax.describe_head(0, 1) == "L0H1, a reset: no source wins most of its 5 queries (a tie)"
    assert tax.describe_head(0, 3) == "L0H3, a reset: no query voted"
    assert tax.basis == "8 windows × 256 tokens of python-reference, last queries"
    assert all(f"{r}: {m}" in repr(tax) for r, m in REGIME_MEANING.items()) and tax.basis in repr(tax)
    # ordered by the lower end of the winner's Wilson interval: 300/300 before 60/100; 9/10 (low
    # 0.60) after 90/100 (low 0.83); the tie and the empty head are uncertain, never listed
    low, _ = tax.share_interval
    assert float(low[0, 2]) > float(low[0, 5]) and not bool(tax.label_uncertain[0, 5])
    assert tax.clearest(3) == {"retriever": [(0, 0), (0, 4)], "mixer": [(0, 2), (0, 5)], "reset": []}
    assert tax.clearest(1) == {"retriever": [(0, 0)], "mixer": [(0, 2)], "reset": []}
    assert tax.clearest(3, uncertain=True) == {"retriever": [(0, 0), (0, 4)], "mixer": [(0, 2), (0, 5)],
                                               "reset": [(0, 1)]}  # the tie; the head without votes never
