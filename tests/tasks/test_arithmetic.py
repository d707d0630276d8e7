"""The generated tool-arithmetic family: deterministic, disjoint splits, exact scoring, and
the shipped files are exactly what the generator writes."""

import hashlib
import json
import re

import pytest

from coa_lab.capture.worked_examples import MATH, MHQA, nearest
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
    val, test = arithmetic.generate("val", 120), arithmetic.generate("test", 120)
    splits = {"train": train, "val": val, "test": test}
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        assert not {t.question for t in splits[a]} & {t.question for t in splits[b]}, (a, b)
    assert all(arithmetic.split_of(t.question) == "train" for t in train)
    assert all(arithmetic.split_of(t.question) == "heldout" for t in val + test)
    assert len({t.question for t in train}) == len(train)  # no repeats within a split either


def test_val_is_the_held_out_prefix_and_test_follows_it():
    # val is the first VAL_ROWS held-out problems whatever n asks for; test never repeats them
    assert [t.question for t in arithmetic.generate("val", 50)] == [
        t.question for t in arithmetic.generate("val", arithmetic.VAL_ROWS)[:50]]
    assert [t.id for t in arithmetic.generate("test", 3)] == ["arith-test-0", "arith-test-1", "arith-test-2"]
    val_q = {t.question for t in arithmetic.generate("val", arithmetic.VAL_ROWS)}
    assert not val_q & {t.question for t in arithmetic.generate("test", 200)}


def test_test_shares_no_expression_or_name_swapped_question_with_train_or_val():
    seen = arithmetic.generate("train", arithmetic.SHIPPED_SIZES["train"]) + arithmetic.generate("val", arithmetic.VAL_ROWS)
    test = arithmetic.generate("test", arithmetic.SHIPPED_SIZES["test"])
    assert not {t.metadata["expression"] for t in test} & {t.metadata["expression"] for t in seen}
    assert not {arithmetic.name_free(t.question) for t in test} & {arithmetic.name_free(t.question) for t in seen}


def test_name_free_hides_only_the_names():
    a = "Mia buys 16 packs of 74 stickers and gives away 662 stickers. How many stickers does Mia have left?"
    b = a.replace("Mia", "Kofi")
    assert a != b and arithmetic.name_free(a) == arithmetic.name_free(b)
    assert arithmetic.name_free("What is 3945 minus 2030?") == "What is 3945 minus 2030?"
    assert arithmetic.name_free("Minas buys") == "Minas buys"  # whole words only


def test_levels_cycle_and_answers_are_the_expression_value():
    tasks = arithmetic.generate("val", 15) + arithmetic.generate("test", 15)
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
    t = arithmetic.generate("test", 1)[0]
    gold = int(t.answers[0])
    assert score(t, str(gold)) == 1.0 and score(t, f"\\boxed{{{gold}}}") == 1.0
    assert score(t, str(gold + 1)) == 0.0 and score(t, None) == 0.0


def test_bad_arguments_fail_clearly():
    with pytest.raises(ValueError, match="split"):
        arithmetic.generate("eval", 1)  # the old split: now val (tuned on) and test
    with pytest.raises(ValueError, match="val has 240"):
        arithmetic.generate("val", arithmetic.VAL_ROWS + 1)  # more would be test's problems
    with pytest.raises(ValueError, match="levels"):
        arithmetic.generate("train", 1, levels=(5,))


def test_shipped_files_are_exactly_the_generator_output(tmp_path):
    arithmetic.write_shipped(tmp_path)
    for split in ("train", "val", "test"):
        shipped = DATASETS_DIR / "math" / "arith" / f"{split}.jsonl"
        assert shipped.read_bytes() == (tmp_path / "math" / "arith" / f"{split}.jsonl").read_bytes()
        # the test file holds the selection split (load_suite's "test") and the confirmation split
        rows = len(load_suite("math", split, benchmark="arith"))
        if split == "test":
            rows += len(load_suite("math", "confirm", benchmark="arith"))
        assert rows == arithmetic.SHIPPED_SIZES[split]
    assert (DATASETS_DIR / "math" / "arith" / "SOURCE.json").read_text() == (tmp_path / "math" / "arith" / "SOURCE.json").read_text()
    assert sorted(p.name for p in (tmp_path / "math" / "arith").iterdir()) == ["SOURCE.json", "test.jsonl", "train.jsonl", "val.jsonl"]
    eval_alias = load_suite("math", "eval", benchmark="arith")
    assert [t.id for t in eval_alias] == [t.id for t in load_suite("math", "test", benchmark="arith")]


# sha256 of train.jsonl and of the old eval.jsonl before val/test existed: train must not move
# (capture, RL and datasets/teacher_runs use its ids), and val must be the old eval rows
OLD_TRAIN_SHA256 = "505e7155e16dccdcd0e61e9f60b66538b62921b36537cc9051b3e57eed67210d"
OLD_EVAL_SHA256 = "0cb4af04335bd88cfc3253b83c52008f3218bfc04f3eefc014ff6d38f666ede5"


def test_train_is_unchanged_and_val_is_the_old_eval_set():
    folder = DATASETS_DIR / "math" / "arith"
    assert hashlib.sha256((folder / "train.jsonl").read_bytes()).hexdigest() == OLD_TRAIN_SHA256
    val = (folder / "val.jsonl").read_bytes()
    assert hashlib.sha256(val.replace(b'"arith-val-', b'"arith-eval-')).hexdigest() == OLD_EVAL_SHA256


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
    shipped = {json.loads(line)["question"] for split in ("train", "val", "test") for fam in ("math/arith", "mhqa/lookup")
               for line in (DATASETS_DIR / fam / f"{split}.jsonl").read_text().splitlines()}
    assert not {ex.question for ex in MATH + MHQA} & shipped


def test_level4_on_demand_four_operations_and_a_distractor():
    """Level 4 (never shipped): its own ids, four operations a problem, one number of the story
    (the distractor) not in the expression, and the held-out splits disjoint from train."""
    for split in ("train", "val", "test"):
        tasks = arithmetic.generate(split, 40, levels=arithmetic.HARD_LEVELS)
        assert all(t.id.startswith(f"arith4-{split}-") for t in tasks)
        for t in tasks:
            assert t.metadata["level"] == 4 and len(re.findall(r"[-+*]", t.metadata["expression"])) == 4
            assert str(eval(t.metadata["expression"], {"__builtins__": {}})) == t.answers[0]  # noqa: S307
            assert int(t.answers[0]) > 0
            used = re.findall(r"[0-9]+", t.metadata["expression"])
            told = re.findall(r"[0-9]+", t.question)
            assert len(used) == 5 and len(told) == 6 and set(used) < set(told)  # one distractor
    train = {t.question for t in arithmetic.generate("train", 400, levels=arithmetic.HARD_LEVELS)}
    held = arithmetic.generate("val", 40, levels=arithmetic.HARD_LEVELS) + arithmetic.generate("test", 40, levels=arithmetic.HARD_LEVELS)
    assert not train & {t.question for t in held}
    # the shipped files are levels 1-3 only
    assert {t.metadata["level"] for t in load_suite("math", "val", benchmark="arith")} == {1, 2, 3}
