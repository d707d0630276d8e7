"""Scorer edge cases: the same functions grade evaluation and produce the RL reward."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coa_lab.tasks import Task, exact_match, f1, math_equal, normalize_answer, reward, score


def _task(profile: str, answers: list[str]) -> Task:
    return Task(id="t", question="q?", answers=answers, source="test", profile=profile)


@pytest.mark.parametrize("raw, expected", [
    ("The Eiffel Tower", "eiffel tower"),
    ("an apple a day", "apple day"),
    ("  Hello,   World!  ", "hello world"),
    ("Wilhelm Conrad Röntgen", "wilhelm conrad rontgen"),
    ("“Quoted” — dash", "quoted dash"),
    ("ﬁne", "fine"),  # NFKD splits the ligature
    ("theater", "theater"),  # articles only as whole words
])
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


@given(st.text(max_size=60))
@settings(max_examples=300, deadline=None)
def test_normalize_answer_is_idempotent(text):
    once = normalize_answer(text)
    assert normalize_answer(once) == once


def test_exact_match_articles_punctuation_unicode():
    assert exact_match("the Chief of Protocol.", ["Chief of Protocol"]) == 1.0
    assert exact_match("Rontgen", ["Röntgen"]) == 1.0
    assert exact_match("Chief", ["Chief of Protocol"]) == 0.0
    assert exact_match("", ["x"]) == 0.0
    assert exact_match(None, ["x"]) == 0.0
    assert exact_match("The The", ["The The"]) == 1.0  # all-article answer still matchable


def test_exact_match_multi_answer_rules():
    assert exact_match("Paris|paris", ["Paris"]) == 1.0  # duplicates collapse
    assert exact_match("Paris|London", ["Paris"]) == 0.0  # hedging is not rewarded
    assert exact_match("b|a", ["a|b"]) == 1.0  # multi-answer gold: order-free set
    assert exact_match("a", ["a|b"]) == 0.0  # incomplete multi-answer


def test_f1():
    assert f1("Wilhelm Röntgen", ["Wilhelm Conrad Rontgen"]) == pytest.approx(0.8)
    assert f1("yes", ["no"]) == 0.0
    assert f1("right|wrong", ["right"]) == pytest.approx(2 / 3)
    assert f1(None, ["x"]) == 0.0


@pytest.mark.parametrize("pred, gold", [
    ("1,000", "1000"), ("$18", "18"), ("18 dollars", "18"), ("18.0", "18"), ("\\$18.00", "18"),
    ("0.5", "\\frac{1}{2}"), ("\\boxed{42}", "42"), ("The answer is $\\boxed{\\frac{1}{2}}$.", "0.5"),
    ("7 \\text{ cm}", "7"), ("50\\%", "50"), ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)"),
])
def test_math_equal_true(pred, gold):
    assert math_equal(pred, gold)


@pytest.mark.parametrize("pred, gold", [
    ("17", "18"), ("1,001", "1000"), ("0.49", "\\frac{1}{2}"), ("\\boxed{}", "0"), ("", "0"), (None, "3"),
])
def test_math_equal_false(pred, gold):
    assert not math_equal(pred, gold)


def test_score_dispatch():
    math_task, qa_task = _task("math", ["18"]), _task("mhqa", ["Chief of Protocol"])
    assert score(math_task, "\\boxed{18}") == 1.0
    assert score(math_task, "<answer>\\boxed{18}</answer>") == 1.0
    assert score(math_task, None) == 0.0
    assert score(qa_task, "chief of protocol") == 1.0
    assert score(_task("web", ["Paris"]), "paris") == 1.0


def test_reward_is_binary_no_partial_credit():
    # F1 would give these partial credit; the RL reward must not (a half-right answer is wrong),
    # and a missing answer is 0, not an error. That the trainer and evaluation reach the SAME
    # value through their own code paths is tested in test_rl_trainer.py.
    qa_task = _task("mhqa", ["Chief of Protocol"])
    assert 0 < f1("Chief", ["Chief of Protocol"]) < 1
    assert reward(qa_task, "Chief") == 0.0
    assert reward(qa_task, "chief of protocol") == 1.0
    assert reward(_task("math", ["18"]), "18.5") == 0.0
    assert reward(_task("math", ["18"]), None) == 0.0


def test_web_profile_uses_judge_only_when_given():
    class Judge:
        calls = 0

        def chat(self, conversations, max_new_tokens, temperature=0.0):
            Judge.calls += 1
            return [type("G", (), {"text": "yes"})()]

    task = _task("web", ["It started on 1 September 2022."])
    assert score(task, "September 2022") == 0.0  # offline: exact match
    assert score(task, "September 2022", judge=Judge()) == 1.0
    assert reward(task, "September 2022", judge=Judge()) == 1.0
    assert score(task, "it started on 1 september 2022", judge=Judge()) == 1.0
    assert Judge.calls == 2  # a verbatim gold never reaches the judge
    assert score(_task("mhqa", ["Paris"]), "City of Paris", judge=Judge()) == 0.0  # judge is web-only


@pytest.mark.parametrize("pred, gold, expected", [
    ("1,000,000", "1000000", 1.0), ("12 km", "12", 1.0), ("\\frac{3}{4}", "0.75", 1.0), ("\\dfrac{3}{4}", "\\frac34", 1.0),
    ("three", "3", 0.0), ("1,000", "1", 0.0),
])
def test_math_numbers_with_commas_units_fractions(pred, gold, expected):
    assert score(_task("math", [gold]), f"<answer>\\boxed{{{pred}}}</answer>") == expected
