"""Every notebook runs end to end in smoke mode; its check cells assert."""

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from coa_lab.paths import PROJECT_ROOT

NOTEBOOKS = sorted((PROJECT_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
pytestmark = pytest.mark.model


def test_notebooks_exist():
    assert NOTEBOOKS, "no notebooks found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_in_smoke_mode(path: Path, tmp_path, monkeypatch):
    monkeypatch.setenv("COA_LAB_SMOKE", "1")
    monkeypatch.setenv("COA_LAB_RUNS", str(tmp_path))  # notebooks write runs here, not into the repo
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
