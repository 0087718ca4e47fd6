"""Geometry of token selection in attention heads, for TransformerLens models.

One door per job: :func:`analyze` measures a model (or a cache) in one streamed pass;
:func:`separability`, :func:`sink_geometry`, :func:`fit_regime` and :func:`sink_aware_bounds`
measure tensors you already have; the interventions ablate, prune and scan heads; ``plots``
draws. docs/api.md lists every name below with one line.

>>> import tl_geometry as tlg
>>> model = tlg.load_model("smollm2-135m")   # doctest: +SKIP
"""

from .backend import Backend
from .capture.adapters import LayerAttention, names_filter, read_layer, stream_layers
from .capture.models import load_model
from .config import AblationMode, Distance, ImportanceMethod, Queries, Ranking, RunConfig
from .errors import TLGeometryError
from .intervene.interventions import (
    HeadAblation,
    ablate_heads,
    ablate_regime,
    head_importance,
    pruning_curve,
    single_head_scan,
    topn_deletion,
)
from .intervene.streaming import StreamingCurve, streaming_curve
from .label.head_types import HeadTypes, head_types
from .label.taxonomy import REGIMES, HeadTaxonomy
from .measure.metrics import Separability, inversion_bounds, random_separability, separability
from .measure.regime import RegimeFit, SinkAwareBounds, fit_regime, sink_aware_bounds
from .measure.sink import SinkGeometry, sink_geometry
from .present import plots
from .run.analysis import Analysis, analyze, tokenize_texts
from .run.compare import Comparison, compare
from .run.geometry import GeometryResult

__version__ = "0.1.0"

__all__ = [
    # running an analysis and its results
    "analyze",
    "Analysis",
    "RunConfig",
    "GeometryResult",
    "HeadTaxonomy",
    "REGIMES",
    "head_types",
    "HeadTypes",
    "tokenize_texts",
    "compare",
    "Comparison",
    "load_model",
    # reading hooks
    "names_filter",
    "read_layer",
    "stream_layers",
    "LayerAttention",
    # measuring tensors
    "separability",
    "Separability",
    "random_separability",
    "inversion_bounds",
    "sink_geometry",
    "SinkGeometry",
    "fit_regime",
    "RegimeFit",
    "sink_aware_bounds",
    "SinkAwareBounds",
    # interventions
    "HeadAblation",
    "ablate_heads",
    "ablate_regime",
    "head_importance",
    "pruning_curve",
    "streaming_curve",
    "StreamingCurve",
    "single_head_scan",
    "topn_deletion",
    # the modes of every public signature
    "Queries",
    "Distance",
    "Ranking",
    "Backend",
    "AblationMode",
    "ImportanceMethod",
    # errors and plots
    "TLGeometryError",
    "plots",
]
