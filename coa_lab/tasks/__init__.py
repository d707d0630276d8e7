"""Tasks: the records the lab solves, the files they come from, and how they are graded.

- :mod:`coa_lab.tasks.records`  -- :class:`Task`, :class:`DatasetError`
- :mod:`coa_lab.tasks.loaders`  -- :func:`load_tasks` (many public layouts), :func:`load_suite`
- :mod:`coa_lab.tasks.scorers`  -- :func:`score` / :func:`reward` (the same function, on purpose)
"""

from coa_lab.tasks.loaders import detect_layout, load_suite, load_tasks, suite_path
from coa_lab.tasks.records import PROFILES, DatasetError, Task
from coa_lab.tasks.scorers import exact_match, f1, math_equal, normalize_answer, reward, score

__all__ = [
    "PROFILES", "DatasetError", "Task",
    "detect_layout", "load_suite", "load_tasks", "suite_path",
    "exact_match", "f1", "math_equal", "normalize_answer", "reward", "score",
]
