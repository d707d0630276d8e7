"""Every notebook runs end to end in smoke mode; its check cells assert.

They run in order in ONE run folder, as a learner runs them: 02 distils 01's capture, 03 trains
on 02's trajectories, 04 and 05 use 03's student. Each notebook opened alone (the fallbacks in
coa_lab/lessons/inputs.py) is tested in tests/lessons/test_lesson_inputs.py."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from coa_lab.lessons.exercises.notebook_cells import self_test_cells
from coa_lab.paths import PROJECT_ROOT

NOTEBOOKS = sorted((PROJECT_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def shared_runs(tmp_path_factory):
    return tmp_path_factory.mktemp("notebook_runs")


def test_notebooks_exist():
    assert NOTEBOOKS, "no notebooks found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_in_smoke_mode(path: Path, shared_runs, monkeypatch):
    monkeypatch.setenv("COA_LAB_SMOKE", "1")
    monkeypatch.setenv("COA_LAB_RUNS", str(shared_runs))  # notebooks write runs here, not into the repo
    nb = nbformat.read(path, as_version=4)
    # after the lesson, each exercise's solution through its check, and a near-miss (coa_lab/lessons/exercises)
    added = self_test_cells(nb)
    nb.cells += [nbformat.v4.new_code_cell("from coa_lab.lessons.exercises import check, wrong_answer")] * bool(added)
    nb.cells += [nbformat.v4.new_code_cell(code) for code in added]
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    # figures render as images (a bare Figure shown as "<Figure size ...>" text was a bug once)
    for c in nb.cells:
        if c.cell_type == "code" and "save_figure(" in "".join(c.source):
            assert any("image/png" in o.get("data", {}) for o in c.outputs), "".join(c.source)[:200]
