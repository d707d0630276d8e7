"""coa_lab/capture/worked_examples.py: the teacher's hand-written worked runs are consistent,
never leak a shipped task, and `nearest` puts the most similar run last."""

from __future__ import annotations

import ast
import operator

import pytest

from coa_lab.capture.worked_examples import BANK, MATH, MHQA, nearest
from coa_lab.tasks.suites import load_suite

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def _value(node):
    """Evaluate + - * // over integers (an independent check of the printed value)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.left), _value(node.right))
    raise ValueError(ast.dump(node))


@pytest.mark.parametrize("run", MATH, ids=lambda r: r.question[:30])
def test_math_runs_print_what_they_compute(run):
    call = ast.parse(run.call, mode="eval").body
    assert isinstance(call, ast.Call) and call.func.id == "print"
    value = _value(call.args[0])
    assert run.observation == run.answer == str(value)
    assert str(value) in run.conclusion


@pytest.mark.parametrize("run", MHQA, ids=lambda r: r.question[:30])
def test_lookup_runs_answer_from_their_passage(run):
    assert run.answer in run.observation  # the reader copies a span; the example must show one
    assert run.call in run.question  # the search query is the question's subject
    assert run.answer in run.conclusion


def test_no_worked_run_is_a_shipped_task():
    """Worked examples sit in the teacher's prompts: a shipped question there would leak its
    answer into capture (train) or into the teacher's held-out evaluation (eval)."""
    shipped = {t.question for split in ("train", "val", "test") for t in load_suite("math", split, benchmark="arith")}
    lookups = [t for split in ("train", "val", "test") for t in load_suite("mhqa", split, benchmark="lookup")]
    shipped |= {t.question for t in lookups}
    subjects = {t.metadata.get("subject") for t in lookups}
    for run in (*MATH, *MHQA):
        assert run.question not in shipped
    for run in MHQA:
        assert run.call not in subjects


def test_nearest_puts_the_closest_run_last_and_keeps_relations_together():
    picked = nearest("mhqa", "Who directed the film Sleep, My Love?", 2)
    assert len(picked) == 2 and all(r.question.startswith("Who directed the film") for r in picked)
    assert [r.question for r in nearest("mhqa", "When did George Stevens die?", 2)] == [
        r.question for r in nearest("mhqa", "When did Alan Turing die?", 2)]  # one shared prefix per relation
    story = nearest("math", "A warehouse holds 7000 boxes. 300 boxes are shipped out and 50 new boxes arrive. "
                            "How many boxes are in the warehouse now?", 2)
    assert story[-1].question.startswith("A warehouse holds")
    assert nearest("chess", "e4?", 2) == []
    assert set(BANK) == {"math", "code", "mhqa"}
