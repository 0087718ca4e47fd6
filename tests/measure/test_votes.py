"""Winner sources, their votes and offsets: the definition on small cases and a loop oracle."""

from __future__ import annotations

import pytest
import torch

from tl_geometry.measure.votes import vote_counts, winner_sources

from ..inputs import random_attention


def test_ties_in_winner_go_to_the_lower_position():
    pattern = torch.full((1, 1, 3, 3), 1 / 3).tril()
    pattern[0, 0, 1] = torch.tensor([0.5, 0.5, 0])
    pattern[0, 0, 0] = torch.tensor([1.0, 0, 0])
    assert winner_sources(pattern, torch.ones(1, 3, 1, 2)).tolist() == [[[-1, 0, 0]]]


def oracle_winners(pattern, v, key_mask):
    batch, heads, n_q, _ = pattern.shape
    group = heads // v.shape[2]
    out = torch.full((batch, heads, n_q), -1, dtype=torch.long)
    for b in range(batch):
        for h in range(heads):
            for t in range(1, n_q):
                if not key_mask[b, t]:
                    continue
                scores = [float(pattern[b, h, t, j] * v[b, j, h // group].norm()) for j in range(t + 1)]
                out[b, h, t] = max(range(t + 1), key=lambda j: (scores[j], -j))
    return out


@pytest.mark.parametrize("kv,lengths", [(2, None), (1, [9, 5]), (4, [6, 9])])
def test_agrees_with_loop_oracle_gqa_and_padding(kv, lengths):
    pattern, v, key_mask = random_attention(2, 4, kv, 9, seed=kv, lengths=lengths, peaked=3.0)
    got = winner_sources(pattern, v, key_mask=key_mask, query_mask=key_mask)
    assert torch.equal(got, oracle_winners(pattern, v, key_mask))


def test_votes_add_over_any_batch_split():
    pattern, v, key_mask = random_attention(5, 4, 2, 8, seed=3, lengths=[8, 6, 8, 3, 7], peaked=2.0)
    whole = vote_counts(pattern, v, key_mask=key_mask, query_mask=key_mask).sum(0)
    parts = sum(vote_counts(pattern[i:j], v[i:j], key_mask=key_mask[i:j], query_mask=key_mask[i:j]).sum(0)
                for i, j in ((0, 2), (2, 3), (3, 5)))
    assert torch.equal(whole, parts)
    real_queries = (key_mask[:, 1:].sum() * 4).item()  # every real query but position 0 votes, per head
    assert whole.sum().item() == real_queries
