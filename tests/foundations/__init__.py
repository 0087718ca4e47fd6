"""Foundations: files, head names, the backend choice."""
