"""The one task record every stage of the lab passes around.

A :class:`Task` is what a policy is asked to solve and what a scorer grades: a question,
the list of acceptable gold answers, and the *profile* that decides which tools the agent
may call and which scorer grades it (see :mod:`coa_lab.tasks.scorers`).

The shipped files under ``datasets/`` are JSON lines whose objects are exactly
``Task.to_dict()``; :func:`Task.from_dict` reads them back.

Code tasks (``profile == "code"``) are graded by their tests, not by ``answers`` (which is
empty).  They carry ``metadata["tests"]`` in this schema (checked by :func:`check_tests`)::

    {
      "style": "assert" | "stdio",
      "cases": [...],          # assert: Python source strings, run one after another in the
                               #   solution's namespace (an AssertionError or any exception
                               #   fails the case); stdio: {"input": str, "output": str}
                               #   pairs, the program reads input from stdin and its stdout
                               #   must equal output (see coa_lab.tasks.code_tests)
      "entry_point": str|None, # function the solution must define (HumanEval), else None
      "prompt": str|None,      # code the solution completes (HumanEval signature+docstring);
                               #   prepended to the solution before the tests run
      "setup": str             # assert style: code run after the solution and before the
                               #   cases (MBPP test_setup_code builds fixtures), or ""
    }

and, when the origin ships one, ``metadata["canonical_solution"]``: a complete program that
passes the tests (the gold answer of :func:`coa_lab.tasks.file_checks.gold_selftest`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Profile = Literal["math", "mhqa", "code", "web"]
PROFILES: tuple[str, ...] = ("math", "mhqa", "code", "web")
TEST_STYLES: tuple[str, ...] = ("assert", "stdio")


class DatasetError(ValueError):
    """A data file (or one row of it) cannot be turned into tasks.

    The message always names the file, and for row problems the 1-based row number, so a
    user can open the file at the right line instead of guessing.
    """


@dataclass
class Task:
    """One verifiable task.

    ``answers`` holds every acceptable gold answer (aliases); a prediction that matches any
    of them scores 1.  ``metadata`` keeps whatever the origin file knew that a scorer does
    not need (solution text, supporting paragraphs, difficulty, ...).
    """

    id: str
    question: str
    answers: list[str]
    source: str
    profile: str  # "math" | "mhqa" | "code" | "web"
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Fail at construction, not deep inside a reward function hours into an RL run.
        if self.profile not in PROFILES:
            raise ValueError(f"Task {self.id!r}: profile must be one of {PROFILES}, got {self.profile!r}")
        if not isinstance(self.question, str) or not self.question.strip():
            raise ValueError(f"Task {self.id!r}: question is empty")
        if isinstance(self.answers, str) or not isinstance(self.answers, list):
            raise ValueError(f"Task {self.id!r}: answers must be a list of strings, got {type(self.answers).__name__}")
        self.answers = [str(a) for a in self.answers]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Task":
        return cls(
            id=str(data["id"]),
            question=data["question"],
            answers=list(data["answers"]),
            source=str(data.get("source", "")),
            profile=data["profile"],
            metadata=dict(data.get("metadata") or {}),
        )


def check_tests(tests: Any) -> dict[str, Any]:
    """Validate a code task's ``metadata["tests"]`` (schema in the module doc) and return it
    with defaults filled in; raise ``ValueError`` saying what is wrong."""
    if not isinstance(tests, dict):
        raise ValueError(f"'tests' must be an object, got {type(tests).__name__}")
    style, cases = tests.get("style"), tests.get("cases")
    if style not in TEST_STYLES:
        raise ValueError(f"tests.style must be one of {TEST_STYLES}, got {style!r}")
    if not isinstance(cases, list) or not cases:
        raise ValueError("tests.cases must be a non-empty list")
    for k, case in enumerate(cases):
        if style == "assert" and not isinstance(case, str):
            raise ValueError(f"tests.cases[{k}] must be Python source (a string) for assert style")
        if style == "stdio" and not (isinstance(case, dict) and isinstance(case.get("input"), str)
                                     and isinstance(case.get("output"), str)):
            raise ValueError(f"tests.cases[{k}] must be {{'input': str, 'output': str}} for stdio style")
    return {"style": style, "cases": cases, "entry_point": tests.get("entry_point"),
            "prompt": tests.get("prompt"), "setup": tests.get("setup") or ""}
