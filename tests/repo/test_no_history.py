"""Development history stays in docs/history.md.

The pages a learner reads (README, the lessons, docs/*.md), the Makefile and the code's docstrings and
comments say what a setting is and what was measured in their own terms; an issue number ("at
issue 57's recipe") means nothing to a reader without the tracker. An external project's issue is a
reference, not history: a line naming a repository (github.com, vllm-project, QwenLM, "owner/repo
issue N") or the AFM release's tracker ("AFM #") may cite one.
"""

from __future__ import annotations

import json
import re

import pytest

from coa_lab.paths import PROJECT_ROOT

ISSUE = re.compile(r"\bissue[ -]\d+", re.IGNORECASE)
EXTERNAL = ("github.com", "vllm-project", "QwenLM", "AFM #")
OWNER_REPO = re.compile(r"\b[\w.-]+/[\w.-]+\s+$")  # "huggingface/transformers issue 27179"

# (path relative to the root, exact line) -> why the line may keep its issue number. Kept for
# string literals written into a dataset file that a test holds byte-identical
# (coa_lab/tasks/arithmetic.py's generated questions): rewording them would change the shipped data.
# None is needed today.
EXCEPTIONS: dict[tuple[str, str], str] = {}


def _files() -> list:
    root = PROJECT_ROOT
    paths = [root / "README.md", root / "Makefile"]
    paths += sorted(p for p in (root / "docs").glob("*.md") if p.name != "history.md")
    paths += sorted((root / "coa_lab").rglob("*.py"))
    paths += sorted((root / "benchmarks").glob("*.py"))
    paths += sorted((root / "notebooks").glob("*.ipynb"))
    return [p for p in paths if p.is_file()]


def _lines(path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".ipynb":
        return text.splitlines()
    cells = json.loads(text)["cells"]  # markdown and code, not outputs
    return [line for c in cells if c["cell_type"] in ("markdown", "code")
            for line in "".join(c["source"]).splitlines()]


def _external(line: str, match: re.Match) -> bool:
    return any(mark in line for mark in EXTERNAL) or bool(OWNER_REPO.search(line[:match.start()]))


def history_lines(path) -> list[str]:
    rel = path.relative_to(PROJECT_ROOT).as_posix()
    found = []
    for n, line in enumerate(_lines(path), 1):
        for m in ISSUE.finditer(line):
            if not _external(line, m) and (rel, line) not in EXCEPTIONS:
                found.append(f"{rel}:{n}: {line.strip()}")
                break
    return found


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.relative_to(PROJECT_ROOT).as_posix())
def test_no_issue_numbers(path):
    found = history_lines(path)
    assert not found, ("an issue number outside docs/history.md (say what was measured or decided in its own "
                       "terms; history goes to docs/history.md):\n" + "\n".join(found))


def test_the_check_sees_what_it_should():
    lines = {  # the matcher on lines: flagged or not
        "at issue 57's recipe": True,
        "Issue 27's targets are not met": True,
        "The issue-13 measurement": True,
        "QwenLM/Qwen3 issue 761, Qwen2-7B": False,
        "(huggingface/transformers issue 27179 caught a": False,
        "see https://github.com/x/y/issues/3 (issue 3)": False,
        "the AFM release's marker tokens (their issue #15)": False,
        "demo_before_issue57.json": False,
    }
    for line, flagged in lines.items():
        hit = any(not _external(line, m) for m in ISSUE.finditer(line))
        assert hit is flagged, line


def test_exceptions_still_needed():
    for (rel, line), why in EXCEPTIONS.items():
        assert why, rel
        assert line in _lines(PROJECT_ROOT / rel), f"{rel}: the excepted line is gone; drop its exception"
