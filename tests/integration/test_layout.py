"""The house's sizes (docs/design.md, "Layout"): no module over 400 lines, no function over 80
lines of code (its docstring aside; the CLI's parser, a list of flags, excepted), and files
replaced through a temporary name only in ``io.py``."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tl_geometry"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
EXEMPT = {("cli/parser.py", "build_parser")}


def _modules():
    return [path for path in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in path.parts]


def _code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from ``def`` to the end, less the docstring's."""
    lines = node.end_lineno - node.lineno + 1
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def test_no_module_is_over_400_lines():
    long = {str(path.relative_to(PACKAGE)): n for path in _modules()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, long


def test_no_function_is_over_80_lines_of_code():
    long = {}
    for path in _modules():
        name = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (name, node.name) not in EXEMPT:
                if (n := _code_lines(node)) > MAX_FUNCTION_LINES:
                    long[f"{name}:{node.name}"] = n
    assert not long, long


def test_the_counts_see_a_long_function():
    source = "def f():\n    '''doc\n    more'''\n" + "    x = 1\n" * 81
    assert _code_lines(ast.parse(source).body[0]) == 82


def test_files_are_replaced_only_through_io():
    replacing = [str(path.relative_to(PACKAGE)) for path in _modules() if path.name != "io.py"
                 and any(call in path.read_text(encoding="utf-8") for call in ("os.replace(", "os.rename(", ".rename("))]
    assert not replacing, replacing
