"""Figures, claims and the HTML report."""
