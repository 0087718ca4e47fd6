"""Interventions: ablating heads, ranking them, pruning and scanning, top-N deletion and streaming
curves, every loss evaluated from the first layer it changes (:mod:`.residual_replay`)."""

from .interventions import (
    HeadAblation,
    TopNDeletion,
    ablate_heads,
    ablate_regime,
    head_importance,
    mean_nll,
    pruning_curve,
    single_head_scan,
    topn_deletion,
)
from .residual_replay import ReplayedForwards
from .streaming import StreamingCurve, streaming_curve

__all__ = ["HeadAblation", "TopNDeletion", "ablate_heads", "ablate_regime", "head_importance", "mean_nll",
           "pruning_curve", "single_head_scan", "topn_deletion", "ReplayedForwards", "StreamingCurve", "streaming_curve"]
