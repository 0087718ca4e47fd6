"""The claims table: each claim's "holds" rule on hand-made results, on both sides of its threshold."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from tl_geometry.label.taxonomy import HeadTaxonomy
from tl_geometry.present.claims import claims_table
from tl_geometry.run.geometry import GeometryResult
from tl_geometry.run.results import Analysis

NS = (1, 2, 4, 8, 16)
SEQ, LAYERS, HEADS = 2, 2, 5


def per_n(values) -> torch.Tensor:
    """The same per-N values for every (sequence, layer, head)."""
    return torch.tensor(values, dtype=torch.float32).expand(SEQ, LAYERS, HEADS, len(NS)).clone()


def per_head(value: float) -> torch.Tensor:
    return torch.full((SEQ, LAYERS, HEADS), value)


def make(**changes) -> Analysis:
    """A run where every claim holds; ``changes`` replace single results. One retriever of 10 heads
    (10%), six mixers, three resets."""
    values = {
        "f_top": per_n([1.0, 0.7, 0.6, 0.4, 0.3]), "f_random": per_n([1.0, 0.3, 0.1, 0.1, 0.1]),
        "precision_top": per_n([1.0, 0.8, 0.7, 0.5, 0.4]), "recall_top": per_n([1.0, 0.6, 0.5, 0.3, 0.2]),
        "norm_ratio": per_head(5.0), "sink_cosine": per_head(-0.2),
        "f_sink_selected": per_n([1.0, 0.3, 0.3, 0.2, 0.2]), "f_sink_unselected": per_n([1.0, 0.8, 0.7, 0.5, 0.4]),
        "align_sink": per_n([0.0] * 5), "align_current": per_n([0.0] * 5),
        "precision_bound": per_n([1.0, 0.5, 0.2, 0.1, 0.1]), "recall_bound": per_n([1.0, 0.5, 0.0, 0.0, 0.0]),
        "precision_certificate": per_n([1.0, 0.4, 0.3, 0.2, 0.1]), "recall_certificate": per_n([1.0, 0.0, 0.0, 0.0, 0.0]),
    }
    votes = torch.zeros(LAYERS, HEADS, 3, dtype=torch.long)
    votes[..., 1] = 9  # mixers ...
    votes[0, 0] = torch.tensor([9, 0, 0])  # ... one retriever
    votes[1, 2:] = torch.tensor([0, 0, 9])  # ... three resets
    tax = HeadTaxonomy.from_votes(votes)
    # mixers align with the sink, the retriever with the current token
    mixer = (tax.label_ids == 1)[None, :, :, None].expand(SEQ, -1, -1, len(NS))
    values["align_sink"] = torch.where(mixer, 0.5, -0.1)
    values["align_current"] = torch.where(mixer, 0.1, 0.6)
    values.update(changes)
    return Analysis(GeometryResult(NS, values, torch.arange(SEQ), {"seed": 0}), tax)


def verdicts(analysis: Analysis, **kwargs) -> dict[str, bool | None]:
    return {row["id"]: row["holds"] for row in claims_table(analysis, **kwargs)}


def test_every_claim_holds_on_the_reference_run():
    got = verdicts(make())
    assert got == {"C1": True, "C2": True, "C3": True, "C4": True, "C5": True, "C6": None, "C7": True,
                   "C8": None, "C9": None, "C10": True, "C11": True}


@pytest.mark.parametrize(("claim", "changes"), [
    ("C1", {"f_random": per_n([1.0, 0.3, 0.7, 0.1, 0.1])}),        # gap < 0 at N = 4
    ("C2", {"norm_ratio": per_head(2.9)}),                          # median ratio below 3
    ("C2", {"norm_ratio": per_head(10.5)}),                         # ... or above 10
    ("C3", {"sink_cosine": per_head(0.1)}),                         # positive alignment
    ("C4", {"f_sink_selected": per_n([1.0, 0.9, 0.3, 0.2, 0.2])}),  # higher at N = 2
    ("C7", {"align_sink": per_n([0.1] * 5)}),                       # mixers no closer to the sink
    ("C10", {"f_random": per_n([1.0, 0.69, 0.59, 0.39, 0.0])}),     # largest gap at N = 16
    ("C11", {"recall_bound": per_n([1.0, 0.61, 0.0, 0.0, 0.0])}),  # one bound above the measurement
])
def test_each_rule_fails_on_the_other_side_of_its_threshold(claim, changes):
    got = verdicts(make(**changes))
    assert got[claim] is False
    assert all(holds is not False for cid, holds in got.items() if cid != claim)


def test_retriever_share_bounds_c5():
    assert verdicts(make())["C5"] is True  # 1 of 10 heads
    analysis = make()
    analysis.taxonomy.votes[0, 0] = torch.tensor([0, 9, 0])  # no retriever left: 0%
    assert verdicts(analysis)["C5"] is False


def test_pruning_scan_and_corpus_rules():
    analysis = make()
    pruning = pd.DataFrame([{"method": m, "retention": r, "delta_nll": d}
                            for m, r, d in [("taxonomy", 0.9, 0.01), ("random", 0.9, 0.02), ("taxonomy", 0.5, 0.10),
                                            ("random", 0.5, 0.09), ("taxonomy", 1.0, 0.0), ("random", 1.0, 0.0)]])
    assert verdicts(analysis, pruning=pruning)["C8"] is False  # worse than random at 0.5
    pruning.loc[pruning.method.eq("taxonomy") & pruning.retention.eq(0.5), "delta_nll"] = 0.05
    assert verdicts(analysis, pruning=pruning)["C8"] is True
    scan = torch.full((LAYERS, HEADS), 0.01)
    assert verdicts(analysis, scan=scan)["C9"] is False
    scan[1, 3] = 1.0  # one head whose removal doubles the loss
    assert verdicts(analysis, scan=scan)["C9"] is True
    same = HeadTaxonomy.from_votes(analysis.taxonomy.votes.clone())
    assert verdicts(analysis, other_taxonomies={"other": same})["C6"] is True
    flipped = analysis.taxonomy.votes.clone().roll(1, dims=-1)
    assert verdicts(analysis, other_taxonomies={"other": HeadTaxonomy.from_votes(flipped)})["C6"] is False
