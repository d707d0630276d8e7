"""What an exercise is and how an answer is checked: the lesson modules register, `check` judges."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Exercise:
    """One exercise. `truth(**context)` computes the right answer from the lesson's own objects
    (never a number typed in here, so a re-run with other data still checks), `wrong(right)` a
    near-miss the self-test feeds the check, `hint` what to look at when the answer is off."""

    id: str
    question: str
    truth: Callable[..., Any]
    hint: str
    wrong: Callable[[Any], Any]
    same: Callable[[Any, Any], bool] | None = None  # default: equal, floats to 1e-6 relative


EXERCISES: dict[str, Exercise] = {}


def register(exercise: Exercise) -> Exercise:
    if exercise.id in EXERCISES:
        raise ValueError(f"exercise {exercise.id!r} registered twice")
    EXERCISES[exercise.id] = exercise
    return exercise


@dataclass
class Verdict:
    ok: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        return self.message

    def _repr_html_(self) -> str:
        colour = "#2e9e53" if self.ok else "#c0392b"
        return f'<div style="border-left:4px solid {colour};padding:2px 8px">{html.escape(self.message)}</div>'


def close(a: Any, b: Any) -> bool:
    """Equal, with floats compared to 1e-6 relative; lists, tuples and dicts element by element."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-9)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    return a == b


def _get(exercise_id: str) -> Exercise:
    if exercise_id not in EXERCISES:
        raise KeyError(f"no exercise {exercise_id!r}; the lessons have: {', '.join(sorted(EXERCISES))}")
    return EXERCISES[exercise_id]


def check(exercise_id: str, answer: Any, **context) -> Verdict:
    """Right, or not yet with a hint. `context`: the lesson objects the right answer is computed from."""
    ex = _get(exercise_id)
    if answer is None:
        return Verdict(False, f"{exercise_id}: not answered yet. {ex.question}")
    right = ex.truth(**context)
    same = ex.same or close
    try:
        ok = bool(same(_plain(answer), _plain(right)))
    except Exception as err:  # an answer of the wrong kind is an answer that is not right yet
        return Verdict(False, f"{exercise_id}: not yet ({type(err).__name__}: {err}). Hint: {ex.hint}")
    if ok:
        return Verdict(True, f"{exercise_id}: right.")
    return Verdict(False, f"{exercise_id}: not yet. Hint: {ex.hint}")


def wrong_answer(exercise_id: str, **context) -> Any:
    """A near-miss of the right answer (the self-test checks that the check rejects it)."""
    ex = _get(exercise_id)
    return ex.wrong(ex.truth(**context))


def _plain(value: Any) -> Any:
    """Tensors and numpy values as Python numbers and lists, so a learner may answer with either."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


def echoes(namespace: dict, truth: Any, skip: str = "") -> list[str]:
    """Names in a lesson's `namespace` whose object already equals the answer `truth`: an exercise a learner
    could pass by echoing what the lesson holds. Integers and booleans are not scanned (a small count matches
    some loop bound or size by chance; their exercises' tests show the held candidates fail), nor are floats
    0 and 1 (every rate and accuracy starts at one of them)."""
    truth = _plain(truth)
    if isinstance(truth, (bool, int)) or truth in (0.0, 1.0):
        return []
    found = []
    for name, value in list(namespace.items()):
        if name.startswith("_") or name == skip or not _scannable(value):
            continue
        try:
            if close(_plain(value), truth):
                found.append(name)
        except Exception:  # noqa: BLE001 -- an object that cannot be compared is not an echo
            continue
    return found


def _scannable(value: Any) -> bool:
    """Plain containers and numbers, and small tensors or arrays (a model's weights are never an answer)."""
    if isinstance(value, (bool, int)):
        return False
    if isinstance(value, (float, list, tuple, dict)):
        return True
    if isinstance(value, type) or not hasattr(value, "tolist") or not hasattr(type(value), "tolist"):
        return False  # modules (torch.tolist is no method of an object), classes, everything without values
    try:
        size = value.numel() if hasattr(value, "numel") else value.size
        return isinstance(size, int) and size <= 10_000
    except Exception:  # noqa: BLE001 -- an object that cannot say its size is not scanned
        return False
