"""Static checks of the notebooks, no kernel: valid files, numbered in order, a parameters cell
first, stored without outputs, no machine-specific paths, and links to notebooks that exist."""

import json
import re

import nbformat
import pytest

from coa_lab.paths import PROJECT_ROOT

NOTEBOOKS = sorted((PROJECT_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_numbered_without_gaps():
    numbers = [int(p.name[:2]) for p in NOTEBOOKS]
    assert numbers == list(range(len(NOTEBOOKS))), [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_valid_and_clean(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    number = path.name[:2]
    title = "".join(nb.cells[0].source).splitlines()[0]
    assert nb.cells[0].cell_type == "markdown" and title.startswith(f"# {number} ·"), title
    code = [c for c in nb.cells if c.cell_type == "code"]
    # the parameters cell: smoke or full, chosen by the environment the test suite sets
    assert "COA_LAB_SMOKE" in "".join(code[0].source), "the first code cell must be the parameters cell"
    # stored without outputs: reviewable diffs, and nothing stale from an older version of the code
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code)
    text = path.read_text()
    assert not re.search(r"(?<![\w.])/(work|tmp|root|home|Users)/", text), "a machine-specific absolute path"
    for other in set(re.findall(r"\b(\d\d_[a-z_]+)\.ipynb", text)):
        assert (path.parent / f"{other}.ipynb").exists(), f"{path.name} points to missing {other}.ipynb"
    for ref in set(re.findall(r'runs_dir\(\) / \\?"nb(\d\d)\\?"', json.dumps(json.loads(text)))):
        assert int(ref) <= int(number), f"{path.name} reads the run folder of a later notebook (nb{ref})"
