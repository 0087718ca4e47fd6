"""Regime labels and TransformerLens's head types."""
