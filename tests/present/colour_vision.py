"""Colours as a deuteranope sees them, for the figures' colour checks."""

from __future__ import annotations

import torch


def deuteranope(hex_color: str) -> torch.Tensor:
    """sRGB 0..1 of ``hex_color`` as a deuteranope sees it (Machado et al. 2009, severity 1, in linear RGB)."""
    srgb = torch.tensor([int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5)], dtype=torch.float64)
    linear = torch.where(srgb <= 0.04045, srgb / 12.92, ((srgb + 0.055) / 1.055) ** 2.4)
    machado = torch.tensor([[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413],
                            [-0.011820, 0.042940, 0.968881]], dtype=torch.float64)
    seen = (machado @ linear).clamp(0, 1)
    return torch.where(seen <= 0.0031308, 12.92 * seen, 1.055 * seen ** (1 / 2.4) - 0.055)
