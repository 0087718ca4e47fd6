"""Interventions: ablating heads, ranking them, pruning and scanning, top-N deletion and streaming
curves, every loss evaluated from the first layer it changes (:mod:`.residual_replay`)."""

from ..config import AblationMode, ImportanceMethod
from .ablation import HeadAblation, ablate_heads, ablate_regime, mean_nll
from .duo_attention import DuoAttentionPattern, duo_attention_pattern
from .importance import head_importance
from .pruning import TopNDeletion, pruning_curve, single_head_scan, topn_deletion
from .streaming import StreamingCurve, streaming_curve

__all__ = ["HeadAblation", "ablate_heads", "ablate_regime", "mean_nll", "head_importance", "pruning_curve",
           "single_head_scan", "topn_deletion", "TopNDeletion", "streaming_curve", "StreamingCurve", "AblationMode",
           "ImportanceMethod", "duo_attention_pattern", "DuoAttentionPattern"]
