"""The one task record every stage of the lab passes around.

A :class:`Task` is what a policy is asked to solve and what a scorer grades: a question,
the list of acceptable gold answers, and the *profile* that decides which tools the agent
may call and which scorer grades it (see :mod:`coa_lab.tasks.scorers`).

The shipped files under ``datasets/`` are JSON lines whose objects are exactly
``Task.to_dict()``; :func:`Task.from_dict` reads them back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Profile = Literal["math", "mhqa", "code", "web"]
PROFILES: tuple[str, ...] = ("math", "mhqa", "code", "web")


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
