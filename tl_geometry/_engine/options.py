"""The compile options the kernels share, each with its reason (docs/design.md, "What the profile
taught"; the measured costs are in docs/performance.md)."""

from __future__ import annotations

__all__ = ["NO_RC", "INLINE", "SUMS"]

# Machine code cached in __pycache__, the GIL released, and no reference counting: the kernels
# allocate nothing per row, and every call would otherwise count each array it is handed up and
# down, atomically, on counts both threads share.
NO_RC = {"cache": True, "nogil": True, "_nrt": False}
# For the per-row and per-N steps: a call passes every array of its bundles field by field (a
# dozen words each), which per row costs more than the work of a short row; inlined, it costs
# nothing.
INLINE = dict(NO_RC, inline="always")
# For float sums whose order is left to the compiler (the row checks' sums, float64 dot
# products): reassociated, LLVM vectorises them; a float reduction in source order stays scalar.
SUMS = {"reassoc", "contract", "nsz"}
