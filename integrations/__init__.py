"""Bridges from tl_geometry's results to other libraries, each tested in its own environment."""
