"""numba's on-disk cache: an index that no longer unpickles (written when a type of its
signatures lived in a module that is gone, as after an upgrade that moved it) is emptied, so the
kernel recompiles instead of failing; readable indexes are left alone."""

from __future__ import annotations

import importlib
import pickle
import sys
from pathlib import Path

import numba
import pytest

from tl_geometry._engine.disk_cache import clear_unreadable_indexes, kernels_cached

KERNEL = '''
from numba import njit


@njit(cache=True)
def twice(x):
    return 2 * x
'''


@pytest.fixture
def cached_module(tmp_path, monkeypatch):
    (tmp_path / "cached_kernel.py").write_text(KERNEL, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("cached_kernel")
    yield module
    sys.modules.pop("cached_kernel", None)


def _index(kernel):
    return kernel._cache._cache_file._index_path


def test_an_unreadable_index_is_emptied_and_the_kernel_recompiles(cached_module):
    kernel = cached_module.twice
    assert not kernels_cached(kernel)
    assert kernel(3) == 6
    assert kernels_cached(kernel)
    assert clear_unreadable_indexes([cached_module]) == []  # readable: untouched
    assert kernel._cache._cache_file._load_index()  # still lists the compiled signature
    with open(_index(kernel), "wb") as f:  # numba's header, then a pickle naming a module that is gone
        pickle.dump(numba.__version__, f, protocol=-1)
        f.write(b"\x80\x04cno_such_module_of_tl_geometry\nBundle\n.")
    with pytest.raises(ModuleNotFoundError):
        kernel._cache._cache_file._load_index()
    assert clear_unreadable_indexes([cached_module]) == ["cached_kernel.twice"]
    assert kernel._cache._cache_file._load_index() == {}
    fresh = numba.njit(cache=True)(cached_module.twice.py_func)
    assert fresh(4) == 8


def test_the_engine_clears_the_indexes_of_every_module_with_cached_kernels():
    import tl_geometry._engine as engine

    with_kernels = {path.stem for path in Path(engine.__file__).parent.glob("*.py")
                    if "@njit" in path.read_text(encoding="utf-8")}
    assert {module.__name__.rsplit(".", 1)[1] for module in engine.KERNEL_MODULES} == with_kernels
