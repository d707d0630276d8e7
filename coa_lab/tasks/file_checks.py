"""CLI helpers of the task layer (the lead wires them into ``coa_lab/cli.py``):

- ``coa-lab data inspect PATH``            -> :func:`data_inspect_main`
- ``coa-lab eval --policy gold --suite PATH`` -> :func:`gold_main` / :func:`gold_selftest`

The gold policy is a harness self-test: it answers every task with its own gold label,
written the way a model would write it (``<answer>...</answer>``, ``\\boxed{}`` for math, a
fenced program for code), extracts it with the same :func:`coa_lab.protocol.final_answer`
the agents use and grades it with the same :func:`~coa_lab.tasks.scorers.score`.  Anything
below 100% is a bug in a loader, the answer path or a scorer, not in a model.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from coa_lab.protocol import final_answer
from coa_lab.tasks.loaders import BadRowsSkipped, layout_of, load_tasks
from coa_lab.tasks.records import DatasetError, Task
from coa_lab.tasks.scorers import score
from coa_lab.tasks.suites import SUITE_FILES, suite_files

TASK_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet")
NON_TASK_DIRS = {"corpus", "trajectories", "teacher_runs"}


def gold_text(task: Task) -> str | None:
    """The final message a perfect policy would write for ``task``; None when the task has
    no gold to write (code without a canonical solution, a task without answers)."""
    if task.profile == "code":
        solution = task.metadata.get("canonical_solution")
        return None if not solution else f"<answer>\n```python\n{solution}\n```\n</answer>"
    if not task.answers:
        return None
    if task.profile == "math":
        return f"<answer>\\boxed{{{task.answers[0]}}}</answer>"
    return f"<answer>{task.answers[0]}</answer>"


def task_files(target: str | Path) -> list[Path]:
    """A task file, every task file under a folder, or a shipped suite name (``math``,
    ``mhqa``, ``code``, ``web``: its eval files; ``math/arith``: one eval benchmark).  In folders, SOURCE.json, dot-files and the
    ``corpus``/``trajectories``/``teacher_runs`` folders of datasets/ are skipped: they hold no tasks."""
    path = Path(target)
    if not path.exists():
        suite, _, benchmark = str(target).partition("/")
        if suite in SUITE_FILES and (not benchmark or benchmark in SUITE_FILES[suite]["eval"]):
            return suite_files(suite, "eval", benchmark or None)
        raise DatasetError(f"{path}: no such file, folder or suite")
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(TASK_SUFFIXES)
                  and p.name != "SOURCE.json" and not p.name.startswith(".")
                  and not NON_TASK_DIRS & set(p.relative_to(path).parts[:-1]))


def _grade(task: Task) -> tuple[Task, str | None, str | None, float | None]:
    text = gold_text(task)
    if text is None:
        return task, None, None, None
    extracted = final_answer(text)
    return task, text, extracted, score(task, extracted)


def gold_selftest(path: str | Path, workers: int = 8, limit: int | None = None) -> dict[str, Any]:
    """Answer every task under ``path`` with its gold; accuracy per file and the failures.

    Returns ``{"accuracy", "scored", "correct", "skipped", "files": {file: {layout, tasks,
    scored, correct, skipped, accuracy}}, "failures": [{file, id, gold, extracted, score}]}``.
    Tasks without a writable gold (code with no canonical solution) are counted as skipped,
    never as passes.  Code tasks run in the sandbox, ``workers`` at a time.
    """
    report: dict[str, Any] = {"files": {}, "failures": []}
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for file in task_files(path):
            tasks = load_tasks(file, limit=limit)
            stats = {"layout": layout_of(file), "tasks": len(tasks), "scored": 0, "correct": 0, "skipped": 0}
            for task, text, extracted, value in pool.map(_grade, tasks):
                if value is None:
                    stats["skipped"] += 1
                    continue
                stats["scored"] += 1
                stats["correct"] += value == 1.0
                if value != 1.0:
                    report["failures"].append({"file": str(file), "id": task.id, "gold": text,
                                               "extracted": extracted, "score": value})
            stats["accuracy"] = stats["correct"] / stats["scored"] if stats["scored"] else None
            report["files"][str(file)] = stats
    files = report["files"].values()
    report["scored"] = sum(s["scored"] for s in files)
    report["correct"] = sum(s["correct"] for s in files)
    report["skipped"] = sum(s["skipped"] for s in files)
    report["accuracy"] = report["correct"] / report["scored"] if report["scored"] else None
    return report


def data_inspect_main(argv: list[str] | None = None) -> int:
    """``coa-lab data inspect PATH``: layout detected, row count, first task (JSON)."""
    parser = argparse.ArgumentParser(prog="coa-lab data inspect", description="Show how the lab reads a task file.")
    parser.add_argument("path", help="a task file (.jsonl, .jsonl.gz, .json, .parquet)")
    parser.add_argument("--skip-bad-rows", action="store_true",
                        help="skip rows that cannot become a task (counted, first reasons shown) instead of stopping")
    args = parser.parse_args(argv)
    skipped: list[str] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BadRowsSkipped)  # reported below, in the JSON
            tasks = load_tasks(args.path, skip_bad_rows=args.skip_bad_rows, skipped=skipped)
        layout = layout_of(args.path)
    except DatasetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if not args.skip_bad_rows:
            print("(--skip-bad-rows loads the rest of the file and counts the rows it skips)", file=sys.stderr)
        return 2
    info = {"path": args.path, "layout": layout, "rows": len(tasks),
            **({"skipped_rows": len(skipped), "first_skipped": skipped[:5]} if args.skip_bad_rows else {}),
            "profiles": sorted({t.profile for t in tasks}),
            "first_task": tasks[0].to_dict() if tasks else None}
    print(json.dumps(info, indent=2, ensure_ascii=False, default=str))
    return 0


def gold_main(argv: list[str] | None = None) -> int:
    """``coa-lab eval --policy gold --suite PATH``: the gold self-test; exit 0 iff 100%."""
    parser = argparse.ArgumentParser(prog="coa-lab eval --policy gold",
                                     description="Answer every task with its own gold label through the normal answer path.")
    parser.add_argument("--policy", default="gold", choices=["gold"], help="only 'gold' is handled here")
    parser.add_argument("--suite", required=True, help="task file, folder of task files, or shipped suite name")
    parser.add_argument("--workers", type=int, default=8, help="parallel graders (code runs in the sandbox)")
    parser.add_argument("--limit", type=int, default=None, help="tasks per file")
    parser.add_argument("--json", type=Path, default=None, help="also write the full report here")
    args = parser.parse_args(argv)
    try:
        report = gold_selftest(args.suite, workers=args.workers, limit=args.limit)
    except DatasetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for file, s in report["files"].items():
        acc = "n/a" if s["accuracy"] is None else f"{100 * s['accuracy']:.1f}%"
        print(f"{acc:>7}  {s['correct']}/{s['scored']} (skipped {s['skipped']})  {s['layout']:<10} {file}")
    for failure in report["failures"][:20]:
        print(f"FAIL {failure['id']}: extracted {str(failure['extracted'])[:120]!r}", file=sys.stderr)
    if len(report["failures"]) > 20:
        print(f"... and {len(report['failures']) - 20} more failures", file=sys.stderr)
    total = "n/a" if report["accuracy"] is None else f"{100 * report['accuracy']:.2f}%"
    print(f"gold self-test: {total} ({report['correct']}/{report['scored']}, skipped {report['skipped']})")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, ensure_ascii=False, default=str), encoding="utf-8")
    return 0 if report["scored"] and report["correct"] == report["scored"] else 1
