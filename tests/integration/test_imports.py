"""The package's import graph: no cycle between modules, and no layer folder imports a folder above
it (engine < foundations < capture < measure < label < run < intervene < present < cli), counting
imports inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tl_geometry"
# folders bottom to top; "" is the top-level foundations (errors, config, backend, io, heads)
FOLDER_ORDER = ("_engine", "", "capture", "measure", "label", "run", "intervene", "present", "cli")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[0] == "_engine":
        return "_engine"  # the sealed engine is one node: tests/engine/test_engine.py keeps its door
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or "__init__"


def _resolve(parts: list[str]) -> str | None:
    """The graph node of a dotted path inside the package (None: the package's own namespace)."""
    if not parts:
        return None
    if parts[0] == "_engine":
        return "_engine"
    while parts:
        if (PACKAGE.joinpath(*parts).with_suffix(".py")).exists() or (PACKAGE.joinpath(*parts) / "__init__.py").exists():
            return ".".join(parts)
        parts = parts[:-1]
    return None


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        if module == "_engine" or "__pycache__" in path.parts:
            graph.setdefault(module, set())
            continue
        package = list(path.relative_to(PACKAGE).parent.parts)
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level >= 1:
                base = package[: len(package) - (node.level - 1)]
                heads = [node.module.split(".")] if node.module else [[alias.name] for alias in node.names]
                targets.update(t for head in heads if (t := _resolve(base + head)) is not None)
        graph.setdefault(module, set()).update(targets - {module})
    return graph


def _folder(module: str) -> str:
    return "_engine" if module == "_engine" else (module.split(".")[0] if "." in module else
                                                  (module if (PACKAGE / module).is_dir() else ""))


def test_no_import_cycle():
    graph = import_graph()
    graph.pop("__init__")  # the package namespace imports everything and nothing imports it back
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            assert state.get(target) != 1, "import cycle: " + " -> ".join(path[path.index(target):] + [target])
            if target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_no_folder_imports_a_folder_above_it():
    graph = import_graph()
    graph.pop("__init__")
    upward = [f"{module} ({_folder(module) or 'top level'}) imports {target} ({_folder(target) or 'top level'})"
              for module, targets in graph.items() for target in targets
              if FOLDER_ORDER.index(_folder(target)) > FOLDER_ORDER.index(_folder(module))]
    assert not upward, upward


def test_every_layer_folder_is_in_the_order_and_the_top_level_is_small():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(FOLDER_ORDER) - {""}
    assert {p.stem for p in PACKAGE.glob("*.py")} <= {"__init__", "errors", "config", "backend", "io", "heads"}


def test_the_graph_sees_function_level_imports():
    graph = import_graph()
    assert "capture.adapters" in graph["present.drilldown"]  # imported inside head_drilldown
    assert "run.run_folder" in graph["run.results"]  # imported inside Analysis.save
