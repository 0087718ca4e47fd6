"""The package's one exception type for user errors.

Everything the caller can fix (a bad argument, a file of the wrong kind, a model the analysis
cannot read) raises :class:`TLGeometryError`; the command line turns exactly these into one line
and exit status 2, so a real bug still shows its traceback. It subclasses ``ValueError``, so
``except ValueError`` in existing code keeps working.
"""

from __future__ import annotations

__all__ = ["TLGeometryError"]


class TLGeometryError(ValueError):
    """Input or state the caller can fix; the message names the problem and the fix."""
