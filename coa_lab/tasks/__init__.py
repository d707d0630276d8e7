"""Tasks: the records the lab solves, the files they come from, and how they are graded.

- :mod:`coa_lab.tasks.records`     -- :class:`Task`, :class:`DatasetError`, the code-tests schema
- :mod:`coa_lab.tasks.loaders`     -- :func:`load_tasks` (many public layouts, detected by keys)
- :mod:`coa_lab.tasks.suites`      -- :func:`load_suite` (the shipped math/mhqa/code/web files)
- :mod:`coa_lab.tasks.scorers`     -- :func:`score` / :func:`reward` (the same function, on purpose)
- :mod:`coa_lab.tasks.code_tests`  -- running code answers against their tests in the sandbox
- :mod:`coa_lab.tasks.judge`       -- :func:`llm_judge` for open-ended (web) answers
- :mod:`coa_lab.tasks.file_checks`     -- ``coa-lab data inspect`` and the gold-policy self-test
"""

from coa_lab.tasks.loaders import detect_layout, layout_of, load_tasks
from coa_lab.tasks.records import PROFILES, DatasetError, Task
from coa_lab.tasks.scorers import exact_match, f1, math_equal, normalize_answer, reward, score, score_code
from coa_lab.tasks.suites import load_suite, suite_files, suite_path
from coa_lab.tasks.judge import llm_judge

__all__ = [
    "PROFILES", "DatasetError", "Task",
    "detect_layout", "layout_of", "load_suite", "load_tasks", "suite_files", "suite_path",
    "exact_match", "f1", "llm_judge", "math_equal", "normalize_answer", "reward", "score", "score_code",
]
