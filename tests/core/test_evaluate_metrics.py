"""coa_lab/evaluate.py: unbiased pass@k and the teacher's token cost."""

from __future__ import annotations

from itertools import combinations
from math import prod

import pytest

from coa_lab.capture.teacher import Activation, TeacherRun
from coa_lab.evaluate import pass_at_k, teacher_cost, teacher_eval


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of all k-subsets of n samples (c of them correct) that hold a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def stable_closed_form(n: int, c: int, k: int) -> float:
    """Chen et al. 2021's numerically stable form: 1 - prod_{i=n-c+1}^{n} (1 - k / i)."""
    if n - c < k:
        return 1.0
    return 1.0 - prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@pytest.mark.parametrize("n", range(1, 9))
def test_matches_brute_force(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_matches_stable_closed_form_large_n():
    for n in (10, 50, 200):
        for c in (0, 1, 3, n // 2, n - 1, n):
            for k in (1, 2, 5, 10):
                assert pass_at_k(n, c, k) == pytest.approx(stable_closed_form(n, c, k), abs=1e-9), (n, c, k)


def test_edge_cases():
    for n in (1, 3, 16):
        for k in range(1, n + 1):
            assert pass_at_k(n, 0, k) == 0.0
            assert pass_at_k(n, n, k) == 1.0
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pytest.approx(c / n)


def test_hand_values():
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(3, 1, 3) == 1.0
    assert pass_at_k(10, 1, 5) == pytest.approx(0.5)


def test_monotone_in_k_and_c():
    n = 12
    for c in range(n + 1):
        vals = [pass_at_k(n, c, k) for k in range(1, n + 1)]
        assert vals == sorted(vals)
    for k in range(1, n + 1):
        vals = [pass_at_k(n, c, k) for c in range(n + 1)]
        assert vals == sorted(vals)


@pytest.mark.parametrize("n,c,k", [(2, 0, 3), (0, 0, 1)])
def test_no_correct_sample_is_never_a_pass(n, c, k):
    try:
        value = pass_at_k(n, c, k)
    except ValueError:
        return  # rejecting k > n is also acceptable
    assert value == 0.0


# ============================================================================ teacher_cost


def _act(agent, p, c, tool=None):
    return Activation(agent=agent, messages=[], output="o", prompt_tokens=p, completion_tokens=c, tool=tool)


def test_teacher_cost():
    runs = [
        TeacherRun("a", "q", "math", ["1"], [_act("planner", 100, 10), _act("coder", 200, 20, tool="code"),
                                               _act("answerer", 300, 5)]),
        TeacherRun("b", "q", "mhqa", ["x"], [_act("planner", 50, 5), _act("searcher", 60, 6, tool="wiki_search"),
                                               _act("searcher", 70, 7, tool="wiki_search"), _act("answerer", 80, 8)]),
    ]
    assert runs[0].tokens == 635 and runs[1].tokens == 286
    cost = teacher_cost(runs)
    assert cost == {
        "runs": 2,
        "tokens_per_task": (635 + 286) / 2,
        "agent_calls_per_task": 3.5,
        "tool_calls_per_task": 1.5,
    }


def test_teacher_cost_empty():
    assert teacher_cost([]) == {"runs": 0}


def test_teacher_cost_counts_every_reread_context():
    # the MAS pays prompt tokens on EVERY activation: doubling the context doubles the cost
    one = TeacherRun("a", "q", "mhqa", ["x"], [_act("thinker", 100, 1) for _ in range(3)])
    two = TeacherRun("a", "q", "mhqa", ["x"], [_act("thinker", 200, 1) for _ in range(3)])
    assert teacher_cost([two])["tokens_per_task"] - teacher_cost([one])["tokens_per_task"] == 300


def test_teacher_eval_grades_with_the_task_scorer_and_counts_cost_per_success():
    def run(tid, answer, tokens):
        r = TeacherRun(tid, "What is 2 + 2?", "math", ["4"])
        r.activations = [Activation("answerer", [], answer, tokens, 0)]
        r.final_answer = answer
        return r

    runs = [run("a", "4", 100), run("b", "5", 300), run("c", "\\boxed{4}", 200)]
    out = teacher_eval(runs, {"a": "x", "b": "x", "c": "y"})
    assert out["all"]["accuracy"] == pytest.approx(2 / 3)
    assert out["all"]["tokens_per_success"] == 150 and out["all"]["tokens_per_task"] == 200
    assert out["x"]["runs"] == 2 and out["x"]["accuracy"] == 0.5 and out["y"]["tokens_per_success"] == 200
    assert teacher_eval([run("d", "9", 10)])["all"]["tokens_per_success"] is None
