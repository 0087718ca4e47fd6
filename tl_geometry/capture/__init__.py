"""Reading a model or a cache: hooks into per-layer attention (every TransformerLens version and
model class differs only here), the hook plumbing of interventions, the bundled models and corpora.

The hook readers for your own loops: :func:`stream_layers` (one forward, a callback per layer),
:func:`read_layer` (a layer of a cache), :data:`names_filter` (for ``run_with_cache``) and the
:class:`LayerAttention` they give."""

from .adapters import LayerAttention, names_filter, stream_layers
from .cache import read_layer

__all__ = ["stream_layers", "names_filter", "read_layer", "LayerAttention"]
