"""The generated tool-arithmetic family: deterministic, disjoint splits, exact scoring, and
the shipped files are exactly what the generator writes."""

import json
import re

import pytest

from coa_lab.agents.worked_examples import MATH, MHQA, nearest
from coa_lab.paths import DATASETS_DIR
from coa_lab.tasks import arithmetic
from coa_lab.tasks.scorers import score
from coa_lab.tasks.suites import load_suite


def test_same_seed_same_tasks_other_seed_other_tasks():
    a, b = arithmetic.generate("train", 60, seed=0), arithmetic.generate("train", 60, seed=0)
    assert [t.to_dict() for t in a] == [t.to_dict() for t in b]
    c = arithmetic.generate("train", 60, seed=1)
    assert [t.question for t in a] != [t.question for t in c]


def test_splits_are_disjoint_and_decided_by_the_question_alone():
    train = arithmetic.generate("train", 600)
    evals = arithmetic.generate("eval", 120)
    assert not {t.question for t in train} & {t.question for t in evals}
    assert all(arithmetic.split_of(t.question) == "train" for t in train)
    assert all(arithmetic.split_of(t.question) == "eval" for t in evals)
    assert len({t.question for t in train}) == len(train)  # no repeats within a split either


def test_levels_cycle_and_answers_are_the_expression_value():
    tasks = arithmetic.generate("eval", 30)
    assert [t.metadata["level"] for t in tasks[:6]] == [1, 2, 3, 1, 2, 3]
    for t in tasks:
        expr = t.metadata["expression"]
        assert re.fullmatch(r"[\d +\-*/]+", expr)
        assert t.answers == [str(eval(expr))] and int(t.answers[0]) >= 0
        assert t.profile == "math" and t.metadata["family"] == "arith"
        # numbers too large to do in the head: a 3+-digit operand or result at every level
        assert max([int(n) for n in re.findall(r"\d+", expr)] + [int(t.answers[0])]) >= 100


def test_level_three_has_a_distractor_number():
    for t in arithmetic.generate("train", 30, levels=(3,)):
        in_question = re.findall(r"\d+", t.question)
        used = re.findall(r"\d+", t.metadata["expression"])
        assert len(in_question) == len(used) + 1, t.question  # one number in the story is not needed


def test_exact_scorer_on_generated_tasks():
    t = arithmetic.generate("eval", 1)[0]
    gold = int(t.answers[0])
    assert score(t, str(gold)) == 1.0 and score(t, f"\\boxed{{{gold}}}") == 1.0
    assert score(t, str(gold + 1)) == 0.0 and score(t, None) == 0.0


def test_bad_arguments_fail_clearly():
    with pytest.raises(ValueError, match="split"):
        arithmetic.generate("test", 1)
    with pytest.raises(ValueError, match="levels"):
        arithmetic.generate("train", 1, levels=(4,))


def test_shipped_files_are_exactly_the_generator_output(tmp_path):
    arithmetic.write_shipped(tmp_path)
    for split in ("train", "eval"):
        shipped = DATASETS_DIR / "math" / "arith" / f"{split}.jsonl"
        assert shipped.read_bytes() == (tmp_path / "math" / "arith" / f"{split}.jsonl").read_bytes()
    assert (DATASETS_DIR / "math" / "arith" / "SOURCE.json").read_text() == (tmp_path / "math" / "arith" / "SOURCE.json").read_text()
    assert len(load_suite("math", "eval", benchmark="arith")) == arithmetic.SHIPPED_SIZES["eval"]


def test_worked_examples_are_correct_and_nearest_picks_the_same_kind():
    for ex in MATH:  # the teacher's hand-written examples must not teach wrong arithmetic
        expr = ex.call.removeprefix("print(").removesuffix(")")
        assert str(eval(expr)) == ex.observation == ex.answer, ex.question
    for ex in MHQA:
        assert ex.answer in ex.observation and ex.call in ex.observation
    q = "A farm has 120 hens and 30 cows. Each hen lays 6 eggs a week. This week the farm sells 300 eggs and buys 50 eggs."
    assert nearest("math", q, 2)[-1].question.startswith("A farm")  # the closest sits last, next to the task
    assert nearest("mhqa", "Who directed the film Jaws?", 1)[0].question.startswith("Who directed")
    assert nearest("web", "anything", 2) == []  # no bank: zero-shot agents


def test_no_worked_example_leaks_a_shipped_task():
    shipped = {json.loads(line)["question"] for split in ("train", "eval") for fam in ("math/arith", "mhqa/lookup")
               for line in (DATASETS_DIR / fam / f"{split}.jsonl").read_text().splitlines()}
    assert not {ex.question for ex in MATH + MHQA} & shipped
