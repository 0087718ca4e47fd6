"""Geometry of token selection in attention heads, for TransformerLens models.

>>> import tl_geometry as tlg
>>> model = tlg.load_model("smollm2-135m")   # doctest: +SKIP
"""

from . import plots
from .adapters import (
    LayerAttention,
    ModelInfo,
    align_value_heads,
    describe_model,
    names_filter,
    read_layer,
    stream_layers,
)
from .analysis import Analysis, analyze, analyze_separability, classify_heads, tokenize_texts
from .compare import Comparison, compare
from .config import RunConfig
from .errors import TLGeometryError
from .geometry import GeometryResult
from .interventions import (
    ABLATION_MODES,
    IMPORTANCE_METHODS,
    HeadAblation,
    ablate_heads,
    ablate_regime,
    head_importance,
    pruning_curve,
    single_head_scan,
    topn_deletion,
)
from .metrics import (
    Separability,
    inversion_bounds,
    random_separability,
    separability,
    separability_over_rankings,
)
from .models import load_model
from .regime import RegimeFit, SinkAwareBounds, fit_regime, sink_aware_bounds
from .sink import SinkGeometry, f_by_sink, sink_geometry
from .taxonomy import REGIMES, HeadTaxonomy, vote_counts, winner_sources

__version__ = "0.1.0"

__all__ = [
    "plots",
    "ABLATION_MODES",
    "IMPORTANCE_METHODS",
    "HeadAblation",
    "ablate_heads",
    "ablate_regime",
    "head_importance",
    "pruning_curve",
    "single_head_scan",
    "topn_deletion",
    "Analysis",
    "RunConfig",
    "Comparison",
    "compare",
    "TLGeometryError",
    "analyze",
    "classify_heads",
    "tokenize_texts",
    "REGIMES",
    "HeadTaxonomy",
    "vote_counts",
    "winner_sources",
    "GeometryResult",
    "Separability",
    "analyze_separability",
    "inversion_bounds",
    "random_separability",
    "separability",
    "separability_over_rankings",
    "LayerAttention",
    "ModelInfo",
    "align_value_heads",
    "describe_model",
    "load_model",
    "read_layer",
    "names_filter",
    "stream_layers",
    "RegimeFit",
    "SinkAwareBounds",
    "fit_regime",
    "sink_aware_bounds",
    "SinkGeometry",
    "f_by_sink",
    "sink_geometry",
]
