"""The demo notebooks run end to end offline (nbclient), and are stored without outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "demos").glob("*.ipynb"))


def test_notebooks_are_stored_without_outputs():
    assert len(NOTEBOOKS) == 6
    for path in NOTEBOOKS:
        cells = nbformat.read(path, as_version=4).cells
        assert all(not c.get("outputs") and c.get("execution_count") is None for c in cells if c.cell_type == "code"), path.name


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path):
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("application/vnd.plotly.v1+json" in o.get("data", {}) or "text/html" in o.get("data", {}) for o in outputs)
