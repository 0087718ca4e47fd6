"""The engine's structure: compiled code lives in ``tl_geometry._engine`` only, kernels stay short
and take few (bundled) arguments, the package imports nothing of the one above it, and importing
it changes no process state."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

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
