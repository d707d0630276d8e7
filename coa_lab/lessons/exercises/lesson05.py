"""Lesson 05's exercises: the unbiased pass@k, tasks whose samples disagree, and what a gain over
the same tasks is worth (won/lost/tied, the paired standard error)."""

from __future__ import annotations

from coa_lab.comparison import paired, task_scores
from coa_lab.evaluate import pass_at_k
from coa_lab.lessons.exercises.registry import Exercise, register

# the pass@k exercise's task: 10 samples, 3 right, pass@5 (the lesson's cell shows n = 4 only)
N, C, K = 10, 3, 5


def _near(tol: float):
    """Equal to `tol` absolute, element by element: answers worked out by hand carry 3 decimals."""
    def same(a, b) -> bool:
        if isinstance(b, (list, tuple)):
            return len(a) == len(b) and all(abs(float(x) - float(y)) <= tol for x, y in zip(a, b))
        return abs(float(a) - float(b)) <= tol
    return same


def _pass_at_k(n: int = N, c: int = C, k: int = K) -> float:
    return pass_at_k(n, c, k)


register(Exercise(
    id="05.pass_at_k",
    question=f"A task is sampled n = {N} times and {C} samples are right. What is the unbiased pass@{K}?",
    truth=_pass_at_k,
    hint="1 - C(n-c, k) / C(n, k): the chance that k samples drawn WITHOUT replacement from the n are all "
         "wrong, subtracted from 1 (math.comb, or coa_lab.evaluate.pass_at_k).",
    # the biased estimate a learner reaches for first: k independent draws at the observed rate
    wrong=lambda right: 1 - (1 - C / N) ** K,
    same=_near(1e-3),
))


def _mixed_tasks(records) -> int:
    """Tasks whose samples disagree: at least one right and one wrong."""
    rewards: dict[str, set] = {}
    for r in records:
        rewards.setdefault(r.task_id, set()).add(r.reward == 1.0)
    return sum(len(seen) == 2 for seen in rewards.values())


register(Exercise(
    id="05.mixed_tasks",
    question="In the test-time scaling run (`sampled`, K samples per task), on how many held-out tasks did the K "
             "samples disagree: at least one right and at least one wrong? (A DAPO group of these samples is one "
             "dynamic sampling keeps.)",
    truth=_mixed_tasks,
    hint="group sampled.records by task_id; a task counts when some of its records have reward 1.0 and some do "
         "not. Neither pass@K nor pass@1 alone gives this count.",
    wrong=lambda right: right + 1,
))


def _paired(before, after) -> dict:
    return paired(task_scores(before), task_scores(after))


register(Exercise(
    id="05.won_lost",
    question="Compare the SFT student with the base model task by task on the held-out tasks: on how many did "
             "SFT score higher (won), lower (lost), the same (tied)? Answer (won, lost, tied).",
    truth=lambda before, after: tuple(_paired(before, after)[k] for k in ("won", "lost", "tied")),
    hint="pair the two models' records by task_id (results[name].records) and compare the rewards; "
         "coa_lab.comparison.paired counts them too.",
    wrong=lambda right: (right[0] + 1, right[1], right[2]),
))


register(Exercise(
    id="05.paired_se",
    question="SFT's accuracy gain over the base model on the same held-out tasks, and its paired standard "
             "error: answer (gain, se). Is the gain more than twice its error?",
    truth=lambda before, after: tuple(_paired(before, after)[k] for k in ("gain", "se")),
    hint="per task d = sft reward - base reward; gain = mean(d), se = stdev(d, with n - 1) / sqrt(n). Paired: "
         "the noise is that of the tasks on which the two disagree.",
    # right gain, wrong error: the check must look at both numbers
    wrong=lambda right: (right[0], right[1] + 0.05),
    same=_near(1e-3),
))
