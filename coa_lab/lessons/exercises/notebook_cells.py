"""Find a lesson's exercises in its notebook: the check calls and the collapsed solutions.

tests/e2e/test_notebooks.py appends `self_test_cells(nb)` to a lesson before its smoke run, so every
solution goes through its check (which must say right) and a near-miss too (which must not);
tests/lessons/test_exercises.py checks that each check has its solution and each id is registered."""

from __future__ import annotations

import ast
import re

SOLUTION = re.compile(r"<summary>Solution · (?P<id>\d\d\.\w+)</summary>\s*```python\n(?P<code>.*?)```", re.S)


def _source(cell) -> str:
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def solutions(nb) -> dict[str, str]:
    """{exercise id: the solution's code} from the notebook's markdown cells."""
    found = {}
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            for m in SOLUTION.finditer(_source(cell)):
                found[m["id"]] = m["code"]
    return found


def check_calls(nb) -> dict[str, ast.Call]:
    """{exercise id: the `check("ID", answer, **context)` call} from the notebook's code cells."""
    found = {}
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        try:
            tree = ast.parse(_source(cell))
        except SyntaxError:  # IPython magics: no exercise cell uses them
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "check"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                found[node.args[0].value] = node
    return found


def self_test_cells(nb) -> list[str]:
    """One code cell per exercise: no object the lesson holds before the solution already equals the answer
    (`echoes`), its solution must pass its check, and a near-miss must not."""
    calls, sols = check_calls(nb), solutions(nb)
    cells = []
    for ex_id, call in calls.items():
        if len(call.args) < 2 or not isinstance(call.args[1], ast.Name):
            raise ValueError(f"{ex_id}: the check's answer must be a variable: check({ex_id!r}, answer_x, ...)")
        var, line = call.args[1].id, ast.unparse(call)
        context = "".join(f", {ast.unparse(k)}" for k in call.keywords)
        truth = f"EXERCISES[{ex_id!r}].truth({context[2:]})"
        cells.append(f"from coa_lab.lessons.exercises.registry import EXERCISES, echoes\n"
                     f"_held = echoes(globals(), {truth}, skip={var!r})\n"
                     f"assert not _held, ('{ex_id} can be passed by echoing what the lesson holds', _held)\n"
                     f"{sols[ex_id]}\n"
                     f"_verdict = {line}\nassert _verdict.ok, ('the solution of {ex_id} fails its check', _verdict)\n"
                     f"{var} = wrong_answer({ex_id!r}{context})\n"
                     f"_verdict = {line}\nassert not _verdict.ok, ('a wrong answer passes {ex_id}', _verdict)\n"
                     f"print({ex_id!r}, 'solution right, near-miss rejected')")
    return cells
