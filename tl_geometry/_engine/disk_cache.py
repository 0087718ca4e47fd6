"""numba's on-disk cache of the kernels: whether the layer pass is in it, and the clearing of
indexes that another layout of the package wrote.

numba keeps each kernel's machine code beside its module (``__pycache__``, or where numba's cache
locator says) under the function's name and line, and an upgrade leaves the old files there. An
index pickles the types of its signatures by module path, so one written when a bundle lived in a
module that is gone no longer unpickles, and numba raises where it would recompile a stale one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from types import ModuleType

from numba.core.dispatcher import Dispatcher

__all__ = ["kernels_cached", "clear_unreadable_indexes"]


def kernels_cached(kernel: Dispatcher) -> bool:
    """Whether ``kernel``'s machine code is in numba's on-disk cache (else its first call compiles
    it). True where numba's cache cannot be read."""
    try:
        return os.path.exists(kernel._cache._cache_file._index_path)
    except AttributeError:  # another numba's internals: say nothing rather than something wrong
        return True


def clear_unreadable_indexes(modules: Iterable[ModuleType]) -> list[str]:
    """Empty the cache index of every cached kernel of ``modules`` that does not load (numba then
    compiles it afresh, as for a stale one); returns their names. Another numba's internals, or a
    cache that cannot be written: nothing is done."""
    cleared = []
    for module in modules:
        for name, kernel in vars(module).items():
            cache_file = getattr(getattr(kernel, "_cache", None), "_cache_file", None)
            if not isinstance(kernel, Dispatcher) or not hasattr(cache_file, "_load_index"):
                continue
            try:
                cache_file._load_index()
            except Exception:  # noqa: BLE001 - any index that cannot be read is stale
                try:
                    cache_file.flush()
                except OSError:
                    continue
                cleared.append(f"{module.__name__}.{name}")
    return cleared
