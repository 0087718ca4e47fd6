"""The ``tl-geometry`` command line: ``analyze``, ``report``, ``prune``, ``stream`` and friends."""

from .parser import build_parser, main

__all__ = ["build_parser", "main"]
