"""Self-checking exercises for the lessons (notebooks/).

In a lesson, an exercise cell ends with

    answer_clip = None   # your answer
    check("04.clip", answer_clip)

which says right, or not yet with a hint; a collapsed "Solution · 04.clip" block under it holds
one way to get there. tests/e2e/test_notebooks.py runs every solution through its check, and a
wrong answer too, after each lesson's smoke run. One module per lesson registers its exercises.
"""

from coa_lab.lessons.exercises import lesson00, lesson01, lesson02, lesson03, lesson04, lesson05, lesson06, lesson07  # noqa: F401 - they register
from coa_lab.lessons.exercises.registry import EXERCISES, Verdict, check, wrong_answer

__all__ = ["EXERCISES", "Verdict", "check", "wrong_answer"]
