"""Runtime checks of the package's annotations in every test run (as TransformerLens does with
beartype): each function of ``tl_geometry`` is checked against its jaxtyping/typing annotations
on every call, shapes included. The compiled engine (``tl_geometry._engine``) has none, and
numba's cache cannot pickle the checked wrappers. A test that passes ill-typed input on purpose
(to test the package's own one-line error) is marked ``ill_typed``."""

from __future__ import annotations

from pathlib import Path

import pytest
from jaxtyping import config, install_import_hook

_PACKAGE = Path(__file__).resolve().parent / "tl_geometry"
# Every module but the package's namespace and the engine: the top-level ones and each folder
# (a folder's name covers its submodules).
CHECKED = sorted([f"tl_geometry.{path.stem}" for path in _PACKAGE.glob("*.py") if path.stem != "__init__"]
                 + [f"tl_geometry.{path.name}" for path in _PACKAGE.iterdir()
                    if (path / "__init__.py").is_file() and path.name != "_engine"])
install_import_hook(CHECKED, "beartype.beartype")


@pytest.fixture(autouse=True)
def _ill_typed(request):
    """Turn the annotation checks off for a test marked ``ill_typed``."""
    if request.node.get_closest_marker("ill_typed") is None:
        yield
        return
    config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        config.update("jaxtyping_disable", False)
