"""The lessons' self-checking exercises (coa_lab/lessons/exercises): the checks judge, and every notebook's
exercise cells have a registered check and a collapsed solution. That each solution passes its
check and a near-miss fails it, with the lesson's own objects, is run after each notebook's smoke
run (tests/e2e/test_notebooks.py)."""

import inspect

import nbformat
import pytest

from coa_lab.lessons.exercises import EXERCISES, Verdict, check, wrong_answer
from coa_lab.lessons.exercises.notebook_cells import check_calls, self_test_cells, solutions
from coa_lab.paths import PROJECT_ROOT

NOTEBOOKS = sorted((PROJECT_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _context_free(ex) -> bool:
    return all(p.default is not inspect.Parameter.empty for p in inspect.signature(ex.truth).parameters.values())


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_exercise_has_a_registered_check_and_a_solution(path):
    nb = nbformat.read(path, as_version=4)
    calls, sols = check_calls(nb), solutions(nb)
    assert len(calls) >= 2, f"{path.name}: at least two exercises that check themselves"
    assert set(calls) == set(sols), f"{path.name}: checks without a solution or solutions without a check"
    for ex_id in calls:
        assert ex_id in EXERCISES, f"{path.name}: {ex_id} is not registered in coa_lab/lessons/exercises"
        assert ex_id.startswith(path.name[:2] + "."), f"{path.name}: {ex_id} belongs to another lesson"
    assert len(self_test_cells(nb)) == len(calls)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    first_check = next(i for i, src in enumerate(code) if "check(" in src)
    assert any("from coa_lab.lessons.exercises import check" in src for src in code[:first_check]), \
        f"{path.name}: `check` is imported before the first exercise uses it"


def test_every_registered_exercise_is_in_its_lesson():
    used = {ex_id for path in NOTEBOOKS for ex_id in check_calls(nbformat.read(path, as_version=4))}
    assert set(EXERCISES) == used, f"registered but in no lesson: {set(EXERCISES) - used}"


@pytest.mark.parametrize("ex_id", sorted(i for i, ex in EXERCISES.items() if _context_free(ex)))
def test_context_free_checks_accept_the_truth_and_reject_a_near_miss(ex_id):
    ex = EXERCISES[ex_id]
    assert check(ex_id, ex.truth()).ok
    assert not check(ex_id, wrong_answer(ex_id)).ok
    assert "Hint" in check(ex_id, wrong_answer(ex_id)).message


def test_unanswered_unknown_and_malformed_answers():
    v = check("04.clip", None)
    assert not v and "not answered yet" in v.message and EXERCISES["04.clip"].question in v.message
    with pytest.raises(KeyError, match="04.clip"):
        check("04.nope", 1)
    v = check("04.advantages", "four numbers")  # the wrong kind of answer: not yet, no traceback
    assert not v.ok and "Hint" in v.message
    assert check("04.advantages", [1.7320, -0.5773, -0.5773, -0.5773]).ok  # 3-4 decimals do
    assert "right" in Verdict(True, "04.x: right.")._repr_html_() and not Verdict(False, "x")


def test_tensor_answers_are_accepted():
    import torch

    assert check("04.advantages", torch.tensor([1.7320, -0.5773, -0.5773, -0.5773])).ok
    mask, adv = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1]]), torch.tensor([0.0, 1.0])
    assert check("04.grad_tokens", 4, loss_mask=mask, adv=adv).ok
    assert not check("04.grad_tokens", 6, loss_mask=mask, adv=adv).ok
