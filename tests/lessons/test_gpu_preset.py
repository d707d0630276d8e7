"""Every lesson under a GPU preset, checked on a machine without one.

A CPU cannot hold a CUDA model, so the bug class "a lesson builds a CPU tensor while the model sits
on the GPU" cannot be caught by running here; it is caught by reading the cells (fast, default run):

- every tensor a lesson builds names its device: each torch factory call in a code cell, or in an
  exercise's solution, passes `device=` or is moved at once (`.to(...)`, `.cuda()`), and so does
  every `tokenizer(..., return_tensors="pt")`;
- the Parameters cell is tagged `parameters`, so `papermill -p PRESET gpu-smoke -p SMOKE True`
  overrides it (papermill puts its values in a cell right after the tagged one); its values are
  independent defaults, and a later cell only fills in `PRESET` when nothing chose it;
- a lesson that trains or samples sizes a GPU preset down in smoke mode (`smoke_sized`);
- the cells a GPU cannot run are listed below (GPU_SKIPPED) and guarded by `if ON_GPU:` with a
  message; each guard's GPU branch is executed here with ON_GPU forced true, and must print why
  and call nothing it guards.

Slow (`pytest -m slow`): each lesson executed end to end in smoke mode with papermill's injected
parameters PRESET = "gpu-smoke" and SMOKE = True, on this machine's CPU: the GPU preset's settings
(bf16 weights, its recipe, batch sizes, anchors) through every cell, at cpu-smoke's counts. The
device itself is not faked; colab-t4 and gpu-3b-qlora are not run (4-bit QLoRA needs CUDA, and
their models are not on this machine): their plans are checked in tests/repo/test_notebooks_static.py.
"""

import ast
import dataclasses
import re
from pathlib import Path

import nbformat
import pytest

from coa_lab.paths import PROJECT_ROOT

NOTEBOOKS = sorted((PROJECT_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
# tensor factories: each makes its tensor on the default device (the CPU) unless told otherwise
# (the *_like ones follow their argument, so they are not listed)
FACTORIES = {"tensor", "as_tensor", "from_numpy", "zeros", "ones", "full", "empty", "arange", "linspace", "logspace",
             "eye", "rand", "randn", "randint", "randperm", "scalar_tensor"}
# lessons that train, capture or sample: under SMOKE a GPU preset must be cut to cpu-smoke's counts
SIZED = {"01_capture", "03_masked_sft", "04_dapo_rl", "05_evaluation", "07_ablations"}
# lesson -> the cells a GPU cannot run (a string each holds), each guarded by `if ON_GPU:`
GPU_SKIPPED = {
    # rl.rollout_int8: torch's dynamic int8 quantization is a CPU kernel (coa_lab/rl/int8_rollouts.py)
    "07_ablations": ["rollout_ablation(", '"07_rollouts.png"', '"07_tis_weights.png"'],
}
GPU_PRESET = "gpu-smoke"  # the one GPU preset whose model ships with the lab


def _nb(path: Path):
    return nbformat.read(path, as_version=4)


def lesson_code(nb) -> list[tuple[str, str]]:
    """(where, source) of every piece of code a learner runs: code cells, and the python blocks of
    the collapsed solutions (the exercises' self-test runs them too)."""
    out = [(f"cell {i}", c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    for i, c in enumerate(nb.cells):
        if c.cell_type == "markdown":
            out += [(f"cell {i} (solution)", block) for block in re.findall(r"```python\n(.*?)```", c.source, re.S)]
    return out


def undeviced_tensors(source: str) -> list[str]:
    """The tensor-building calls in `source` that leave their tensor on the default device."""
    tree = ast.parse(source)
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def moved(call: ast.Call) -> bool:  # call(...).to(...) / .cuda(...)
        attr = parent.get(call)
        return (isinstance(attr, ast.Attribute) and attr.attr in ("to", "cuda")
                and isinstance(parent.get(attr), ast.Call) and parent[attr].func is attr)

    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        factory = (isinstance(func, ast.Attribute) and func.attr in FACTORIES
                   and isinstance(func.value, ast.Name) and func.value.id == "torch")
        pt = any(k.arg == "return_tensors" and isinstance(k.value, ast.Constant) and k.value.value == "pt"
                 for k in node.keywords)
        if (factory and not any(k.arg == "device" for k in node.keywords) or pt) and not moved(node):
            bad.append(ast.unparse(node)[:120])
    return bad


def test_the_device_check_finds_what_it_should():
    assert undeviced_tensors("seq = torch.tensor([ids])") == ["torch.tensor([ids])"]
    assert undeviced_tensors("x = torch.ones(1, 3)\ny = torch.log(torch.tensor(cap))") == ["torch.ones(1, 3)",
                                                                                          "torch.tensor(cap)"]
    assert undeviced_tensors('batch = tok(text, return_tensors="pt")') == ["tok(text, return_tensors='pt')"]
    assert not undeviced_tensors("seq = torch.tensor([ids], device=model.device)\n"
                                 "m = torch.zeros(2).to(device)\nb = tok(t, return_tensors='pt').to(model.device)\n"
                                 "z = torch.ones_like(seq)\nw = torch.exp(seq)\nl = [1, 2].copy()")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_tensor_a_lesson_builds_names_its_device(path):
    """On a GPU preset the model sits on CUDA: a tensor built on the default device would meet it
    in a different place (notebook 07's TIS histogram did)."""
    found = [(where, call) for where, src in lesson_code(_nb(path)) for call in undeviced_tensors(src)]
    assert not found, f"{path.name}: pass device= (the model's: model.device) or .to(...): {found}"


def _parameters_cell(nb):
    code = [c for c in nb.cells if c.cell_type == "code"]
    return code[0]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_parameters_cell_is_tagged_for_papermill_and_holds_independent_defaults(path):
    cell = _parameters_cell(_nb(path))
    assert "parameters" in cell.metadata.get("tags", []), f"{path.name}: tag the Parameters cell 'parameters'"
    tree = ast.parse(cell.source)
    names = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
    assert {"SMOKE", "PRESET"} <= names
    for node in tree.body:
        if isinstance(node, ast.Assign):
            # a value computed from another parameter would keep its default when papermill sets that one
            used = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)} & names
            assert not used, f"{path.name}: {ast.unparse(node)} depends on {used}: compute it after the parameters"


def _injected(values: dict) -> str:
    """The cell papermill adds after the tagged one (its Python translator: one assignment a line)."""
    return "# Parameters\n" + "".join(f"{k} = {v!r}\n" for k, v in values.items())


def _what_the_lesson_runs(nb, injected: dict | None) -> dict:
    """SMOKE and PRESET as the lesson's cells leave them: the parameters cell, papermill's cell,
    then every later top-level statement that assigns either."""
    scope: dict = {}
    exec(_parameters_cell(nb).source, scope)
    if injected is not None:
        exec(_injected(injected), scope)
    later = [c for c in nb.cells if c.cell_type == "code"][1:]
    for cell in later:
        for node in ast.parse(cell.source).body:
            targets = {t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)}
            if targets & {"SMOKE", "PRESET"}:
                # the only later word on them: fill in PRESET when nothing chose it
                assert targets == {"PRESET"} and ast.unparse(node.value).startswith("PRESET or"), ast.unparse(node)
                exec(ast.unparse(node), scope)
    return {"SMOKE": scope["SMOKE"], "PRESET": scope["PRESET"]}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_papermill_parameters_and_the_environment_decide_the_preset(path, monkeypatch):
    nb = _nb(path)
    monkeypatch.delenv("COA_LAB_PRESET", raising=False)
    monkeypatch.delenv("COA_LAB_SMOKE", raising=False)
    assert _what_the_lesson_runs(nb, None) == {"SMOKE": False, "PRESET": "cpu-tiny"}
    assert _what_the_lesson_runs(nb, {"SMOKE": True}) == {"SMOKE": True, "PRESET": "cpu-smoke"}
    assert _what_the_lesson_runs(nb, {"PRESET": GPU_PRESET, "SMOKE": True}) == {"SMOKE": True, "PRESET": GPU_PRESET}
    monkeypatch.setenv("COA_LAB_PRESET", GPU_PRESET)
    monkeypatch.setenv("COA_LAB_SMOKE", "1")
    assert _what_the_lesson_runs(nb, None) == {"SMOKE": True, "PRESET": GPU_PRESET}
    assert _what_the_lesson_runs(nb, {"PRESET": "cpu-smoke"})["PRESET"] == "cpu-smoke"  # papermill's word wins


def test_papermill_puts_its_cell_right_after_the_tagged_one():
    papermill = pytest.importorskip("papermill.parameterize")  # not a dependency: checked where installed
    nb = papermill.parameterize_notebook(_nb(NOTEBOOKS[0]), {"PRESET": GPU_PRESET, "SMOKE": True})
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.tags and "injected-parameters" in code[1].metadata.tags


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.stem in SIZED], ids=lambda p: p.name)
def test_a_lesson_that_trains_or_samples_sizes_a_gpu_preset_down_in_smoke_mode(path):
    code = "\n".join(src for _, src in lesson_code(_nb(path)))
    assert "smoke_sized(" in code, f"{path.name}: under SMOKE, preset = smoke_sized(preset) (coa_lab/lessons/inputs.py)"


def test_smoke_sized_keeps_the_preset_and_cuts_its_counts():
    from coa_lab.config import get_preset
    from coa_lab.lessons.inputs import smoke_sized

    assert smoke_sized(get_preset("cpu-smoke")) == get_preset("cpu-smoke")
    for name in ("gpu-smoke", "colab-t4", "gpu-3b-qlora"):
        full, small = get_preset(name), smoke_sized(get_preset(name))
        # the model as the preset has it, but for compiled training layers (a smoke stage trains for less
        # time than compiling takes: planning/shrunk.smoke_counts)
        assert not small.model.cpu_compile
        assert small.name == name and dataclasses.replace(small.model, cpu_compile=full.model.cpu_compile) == full.model
        assert small.gen == full.gen
        assert small.rl.steps == 1 and small.rl.prompts_per_step <= 2 and small.rl.group_size <= 2
        assert set(small.rl.pool) == set(full.rl.pool) and max(small.rl.pool.values()) <= 2
        assert set(small.eval.tasks) == set(full.eval.tasks) and max(small.eval.tasks.values()) <= 2
        assert small.rl.learning_rate == full.rl.learning_rate and small.rl.sft_coef == full.rl.sft_coef


def _guarded_cells(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"
            and any(isinstance(n, ast.If) and ast.unparse(n.test) == "ON_GPU" for n in ast.parse(c.source).body)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_cells_a_gpu_cannot_run_are_the_listed_ones(path):
    nb = _nb(path)
    guarded = _guarded_cells(nb)
    listed = GPU_SKIPPED.get(path.stem, [])
    assert sorted(next((m for m in listed if m in src), src[:80]) for src in guarded) == sorted(listed), \
        f"{path.name}: every `if ON_GPU:` guard is listed in GPU_SKIPPED, and every listed cell is guarded"
    if guarded:
        assert any("ON_GPU = torch.cuda.is_available()" in c.source for c in nb.cells if c.cell_type == "code")


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.stem in GPU_SKIPPED], ids=lambda p: p.name)
def test_on_a_gpu_the_guarded_cells_say_why_and_run_nothing_they_guard(path, monkeypatch, capsys):
    """Each guarded cell executed with ON_GPU true: it prints its reason, and the CPU-only code it
    guards (int8 samplers, the rollout ablation) is never called."""
    import coa_lab.lessons.ablations
    import coa_lab.rl.int8_rollouts

    def refuse(*a, **k):
        raise AssertionError("a guarded cell ran CPU-only code with ON_GPU true")

    monkeypatch.setattr(coa_lab.lessons.ablations, "rollout_ablation", refuse)
    monkeypatch.setattr(coa_lab.rl.int8_rollouts, "Int8Rollouts", refuse)
    scope = {"ON_GPU": True, "display": refuse}
    for src in _guarded_cells(_nb(path)):
        exec(src, scope)
        said = capsys.readouterr().out
        assert "skipped on a GPU" in said and "CPU" in said, src[:200]
    assert scope.get("rollout_runs", "unset") is None  # the checks cell skips Run 3's checks on it


# ---- slow: every lesson run in smoke mode under the GPU preset's settings (CPU) ----

def inject_parameters(nb, values: dict):
    """papermill's parameterize_notebook, without papermill: a cell tagged injected-parameters
    right after the one tagged parameters."""
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    tagged = [i for i in code if "parameters" in nb.cells[i].metadata.get("tags", [])]
    assert tagged, "no cell tagged 'parameters': papermill would put its values first, and the lesson's own overwrite them"
    cell = nbformat.v4.new_code_cell(_injected(values))
    cell.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(tagged[0] + 1, cell)
    return nb


@pytest.fixture(scope="module")
def gpu_preset_runs(tmp_path_factory):
    return tmp_path_factory.mktemp("gpu_preset_runs")


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_lesson_runs_in_smoke_mode_under_the_gpu_preset(path, gpu_preset_runs, monkeypatch):
    """In order, in one run folder, as test_notebooks.py runs them on cpu-smoke."""
    from nbclient import NotebookClient

    code = "\n".join(src for _, src in lesson_code(_nb(path)))
    if path.stem in SIZED and "smoke_sized(" not in code:  # would run gpu-smoke's full counts on a CPU: hours
        pytest.fail(f"{path.name} does not size a GPU preset down in smoke mode (smoke_sized)")
    monkeypatch.delenv("COA_LAB_PRESET", raising=False)
    monkeypatch.setenv("COA_LAB_SMOKE", "1")
    monkeypatch.setenv("COA_LAB_RUNS", str(gpu_preset_runs))
    nb = inject_parameters(_nb(path), {"PRESET": GPU_PRESET, "SMOKE": True})
    NotebookClient(nb, timeout=1800, startup_timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    said = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "skipped on a GPU" not in said  # on a CPU every guarded cell runs


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_lesson_forces_packed_batches(path):
    """Under unsloth (gpu-3b-qlora) `model_inputs` refuses a packed batch: the library decides where packing runs
    (`packing.supported(model)`). A lesson passes no `packed=` to a library call, and a cell that builds a packed
    batch itself runs it only where `packing.supported` says the model can take it."""
    for where, src in lesson_code(_nb(path)):
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        forced = [k for node in ast.walk(tree) if isinstance(node, ast.Call) for k in node.keywords if k.arg == "packed"]
        assert not forced, f"{path.name} {where}: leave `packed` to the library"
        if "pack_batch(" in src:
            assert "packing.supported(" in src, f"{path.name} {where}: a packed batch without packing.supported"
