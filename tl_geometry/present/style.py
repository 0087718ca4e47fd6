"""What every figure shares: the regime colours (colour-blind safe) and text made safe for plotly's HTML labels."""

from __future__ import annotations

import html
from typing import Any

# Okabe–Ito colours: distinguishable with every common colour-vision deficiency (the test checks
# them under a simulated deuteranopia).
REGIME_COLORS = {"retriever": "#0072B2", "mixer": "#E69F00", "reset": "#CC79A7"}


def safe_text(text: Any) -> str:
    """A string for plotly's text (hover, ticks, legends, titles), which reads a subset of HTML:
    ``<``, ``>`` and ``&`` escaped so no tag opens; quotes kept, since plotly shows ``&quot;`` as
    those six characters."""
    return html.escape(str(text), quote=False)
