"""The engine's structure: compiled code lives in ``tl_geometry._engine`` only, kernels stay short
and take few (bundled) arguments, the package imports nothing of the one above it, and importing
it changes no process state; warm kernels stay on numba's fast dispatch."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import torch

PACKAGE = Path(__file__).resolve().parents[2] / "tl_geometry"
ENGINE = PACKAGE / "_engine"
MAX_PARAMETERS = 12
MAX_LINES = 60


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
    return names


def _compiled_functions():
    for path in sorted(ENGINE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and any("njit" in ast.unparse(d) for d in node.decorator_list):
                yield path.name, node


def test_numba_is_imported_by_the_engine_only():
    outside = [path.relative_to(PACKAGE) for path in PACKAGE.rglob("*.py")
               if ENGINE not in path.parents and "numba" in _imports(path)]
    assert not outside


def test_the_engine_imports_nothing_of_the_package_above_it():
    for path in ENGINE.glob("*.py"):
        assert not {name for name in _imports(path) if name.startswith("..")}, path.name


def test_compiled_functions_take_few_arguments_and_stay_short():
    functions = list(_compiled_functions())
    assert len(functions) > 20  # the check sees the kernels
    for module, node in functions:
        n_args = len(node.args.args)
        lines = node.end_lineno - node.lineno + 1 - len(ast.get_docstring(node).splitlines())
        assert n_args <= MAX_PARAMETERS, f"{module}:{node.name} takes {n_args} arguments"
        assert lines <= MAX_LINES, f"{module}:{node.name} runs {lines} lines"


def test_importing_the_package_writes_no_environment_and_sizes_no_thread_pool():
    code = ("import os; before = dict(os.environ); import tl_geometry, tl_geometry._engine; "
            "from numba.np.ufunc import parallel; "
            "assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items()); "
            "assert not parallel._is_initialized")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_NUM_THREADS"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_warm_kernels_are_dispatched_without_python_typing(monkeypatch):
    """Once compiled, a kernel call is matched by numba's fast dispatch. numba's per-process type
    table does not tell apart two NamedTuple classes of one name and one shape, so such a pair would
    send the one typed second through ``_compile_for_args`` and Python's ``typeof`` on every call
    (about 1 ms each; found when two copies of the package shared a process)."""
    import numba.core.dispatcher as dispatcher
    import pytest

    import tl_geometry as tlg
    from tests.inputs import FEW_VOTES_WARNING, random_attention
    from tests.tiny import random_tokens, tiny_model

    model = tiny_model()
    tokens = random_tokens(2, 24)
    pattern, v, _ = random_attention(2, 4, 2, 24, dtype=torch.float32)

    def every_kernel_entry():
        for queries in ("last", "all"):
            tlg.analyze(model, tokens, n=(1, 2, 4), queries=queries, progress=False)
        tlg.separability(pattern, v, (1, 2, 4))
        tlg.random_separability(pattern, v, (1, 2, 4))
        tlg.sink_geometry(pattern, v, (1, 2, 4))
        tlg.sink_aware_bounds(pattern, v, (1, 2, 4))

    with pytest.warns(UserWarning, match=FEW_VOTES_WARNING):
        every_kernel_entry()  # compile (or load) every signature
    slow = []
    compile_for_args = dispatcher.Dispatcher._compile_for_args
    monkeypatch.setattr(dispatcher.Dispatcher, "_compile_for_args",
                        lambda self, *args, **kw: slow.append(self.py_func.__qualname__)
                        or compile_for_args(self, *args, **kw))
    with pytest.warns(UserWarning, match=FEW_VOTES_WARNING):
        every_kernel_entry()
    assert slow == []
