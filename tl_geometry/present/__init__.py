"""Presenting results: plotly figures, the claims table and the HTML report."""
