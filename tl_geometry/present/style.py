"""What every figure shares: the regime colours (colour-blind safe) and text made safe for plotly's HTML labels."""

from __future__ import annotations

import html
from typing import Any

# Okabe–Ito colours: distinguishable with every common colour-vision deficiency (the test checks
# them under a simulated deuteranopia).
REGIME_COLORS = {"retriever": "#0072B2", "mixer": "#E69F00", "reset": "#CC79A7"}


def safe_text(text: Any) -> str:
    """HTML-escaped string (quotes included): safe inside plotly text and any HTML attribute."""
    return html.escape(str(text), quote=True)
