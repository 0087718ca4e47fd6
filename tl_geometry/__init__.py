"""Geometry of token selection in attention heads, for TransformerLens models.

One door per job: :func:`analyze` measures a model (or a cache) in one streamed pass;
:func:`separability`, :func:`sink_geometry`, :func:`fit_regime` and :func:`sink_aware_bounds`
measure tensors you already have; ``capture`` reads hooks yourself; ``intervene`` ablates,
prunes and scans heads; ``plots`` draws. docs/api.md lists every name below with one line.

>>> import tl_geometry as tlg
>>> model = tlg.load_model("smollm2-135m")   # doctest: +SKIP
"""

import importlib
import warnings

from . import capture, intervene
from .backend import Backend
from .capture.models import load_model
from .config import Distance, Queries, Ranking, RunConfig
from .errors import TLGeometryError
from .label.head_types import HeadTypes, head_types
from .label.taxonomy import REGIMES, HeadTaxonomy
from .measure.certificates import SinkAwareBounds, sink_aware_bounds
from .measure.metrics import Separability, inversion_bounds, random_separability, separability
from .measure.regime import RegimeFit, fit_regime
from .measure.sink import SinkGeometry, sink_geometry
from .present import plots
from .run.analysis import analyze
from .run.compare import Comparison, compare
from .run.geometry import GeometryResult
from .run.inputs import tokenize_texts
from .run.results import Analysis

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
    # the modes of every measuring signature
    "Queries",
    "Distance",
    "Ranking",
    "Backend",
    # errors, and the folders of hook readers, interventions and plots
    "TLGeometryError",
    "capture",
    "intervene",
    "plots",
]

# Names that moved under tlg.capture and tlg.intervene: still served here, with a warning, for one release.
_MOVED = {**{name: "capture" for name in ("names_filter", "read_layer", "stream_layers", "LayerAttention")},
          **{name: "intervene" for name in ("HeadAblation", "ablate_heads", "ablate_regime", "head_importance",
                                            "pruning_curve", "streaming_curve", "StreamingCurve", "single_head_scan",
                                            "topn_deletion", "AblationMode", "ImportanceMethod")}}


def __getattr__(name: str):
    if name in _MOVED:
        warnings.warn(f"tlg.{name} is now tlg.{_MOVED[name]}.{name}; the old name goes in the next release.",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(f"{__name__}.{_MOVED[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}: its public names are dir(tl_geometry) "
                         "(docs/api.md); hook readers are in tlg.capture, interventions in tlg.intervene, figures in "
                         "tlg.plots")
