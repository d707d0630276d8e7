"""Write tasks in the AFM release's RL parquet layout (verl), the layout ``load_tasks`` reads.

One row per task, matching the release's own files (``AFM/data/code_agent/...``)::

    data_source   str   the benchmark ("MATH500", "hotpotqa", ...): verl picks the reward by it
    prompt        list  [{"content": "<instructions>\\n\\nTask:\\n<question>", "role": "user"}]
    ability       str   "coding" for code, else "fact-reasoning" (what the release writes)
    reward_model  {"ground_truth": ..., "style": "rule"}
    extra_info    {"index": str, "need_tools_kwargs": True, "split": str,
                   "tools_kwargs": {tool: {"TODO": "create_kwargs"}}, ...}
                  (that "TODO" value is verbatim what the release's own files carry; verl reads it)

``ground_truth`` is a string for math (the answer) and for code (JSON text:
``{"stdin": [...], "expected_output": [...]}`` or ``{"functional": "<assert code>"}``); MHQA
rows use the Search-R1 layout the AFM MHQA agent trains on, ``{"target": [answers]}``,
so aliases survive.  Those two shapes cannot share one parquet column, so MHQA tasks go to
their own file (the release keeps one file per benchmark anyway).

    save_afm_parquet(load_suite("math", "eval"), "runs/afm/math_eval.parquet")
    load_tasks("runs/afm/math_eval.parquet")  # the same questions and answers back
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from coa_lab.prompts import coa_system_prompt
from coa_lab.protocol import PROFILE_TOOLS
from coa_lab.tasks.loaders import MHQA_SOURCES
from coa_lab.tasks.records import Task

# The loader (coa_lab.tasks.loaders._parse_afm) splits the prompt at the last "Task:".
TASK_MARKER = "Task:"
ABILITY = {"math": "fact-reasoning", "mhqa": "fact-reasoning", "code": "coding"}


def _check(task: Task) -> None:
    if task.profile not in ABILITY:
        raise ValueError(f"task {task.id!r}: profile {task.profile!r} has no AFM RL layout the loader reads back "
                         f"(supported: {sorted(ABILITY)})")
    if TASK_MARKER in task.question:
        raise ValueError(f"task {task.id!r}: question contains {TASK_MARKER!r}, so a reader could not tell "
                         "the instructions from the question")
    if task.profile == "mhqa" and task.source.lower() not in MHQA_SOURCES:
        # The loader reads any other non-code data_source back as math.
        raise ValueError(f"task {task.id!r}: MHQA source {task.source!r} would be read back as math; "
                         f"use one of {MHQA_SOURCES}")
    if task.profile != "code" and not task.answers:
        raise ValueError(f"task {task.id!r}: no gold answer to write as ground_truth")


def _code_ground_truth(task: Task) -> str:
    tests = task.metadata.get("tests")
    if not isinstance(tests, dict) or not tests.get("cases"):
        raise ValueError(f"task {task.id!r}: code task without metadata['tests']")
    if tests["style"] == "stdio":
        truth: dict[str, Any] = {"stdin": [c["input"] for c in tests["cases"]],
                                 "expected_output": [c["output"] for c in tests["cases"]]}
    else:
        # One assert program, as the release's functional tests are: setup first (it may
        # define fixtures the cases use), then every case in order.
        truth = {"functional": "\n".join(p for p in [tests.get("setup") or "", *tests["cases"]] if p)}
    truth["question_id"] = task.id
    return json.dumps(truth, ensure_ascii=False)


def _ground_truth(task: Task) -> Any:
    if task.profile == "code":
        return _code_ground_truth(task)
    if task.profile == "mhqa":
        return {"target": list(task.answers)}
    if len(task.answers) != 1:
        # A string column holds one answer; joining several would invent a new one.
        raise ValueError(f"task {task.id!r}: math ground_truth is one answer, got {len(task.answers)}")
    return task.answers[0]


def _extra_info(task: Task, split: str) -> dict[str, Any]:
    # The loader builds the id as f"{data_source}-{index}": strip our own source prefix so
    # the id survives the round trip.
    prefix = f"{task.source}-"
    index = task.id[len(prefix):] if task.id.startswith(prefix) and task.id != prefix else task.id
    tool = PROFILE_TOOLS[task.profile][0]
    extra: dict[str, Any] = {"index": index, "need_tools_kwargs": True, "split": split,
                             "tools_kwargs": {tool: {"TODO": "create_kwargs"}}}
    if task.profile == "code":
        entry = (task.metadata.get("tests") or {}).get("entry_point")
        extra["metadata"] = json.dumps({"func_name": entry} if entry else {})
        extra["starter_code"] = str(task.metadata.get("starter_code") or "")
    return dict(sorted(extra.items()))  # the release's files list these keys alphabetically


def to_afm_row(task: Task, system_prompt: str, split: str = "test") -> dict[str, Any]:
    """One task as an AFM/verl RL row (instructions and question in one user message)."""
    _check(task)
    content = f"{system_prompt.rstrip()}\n\n{TASK_MARKER}\n{task.question.strip()}"
    return {
        "data_source": task.source,
        "prompt": [{"content": content, "role": "user"}],
        "ability": ABILITY[task.profile],
        "reward_model": {"ground_truth": _ground_truth(task), "style": "rule"},
        "extra_info": _extra_info(task, split),
    }


def to_afm_rows(tasks: Iterable[Task], system_prompt_for: Callable[[str], str] = coa_system_prompt,
                split: str = "test") -> list[dict[str, Any]]:
    """Tasks as AFM RL rows; ``system_prompt_for(profile)`` gives each row's instructions."""
    prompts: dict[str, str] = {}
    rows = []
    for task in tasks:
        if task.profile not in prompts and task.profile in ABILITY:
            prompts[task.profile] = system_prompt_for(task.profile)
        rows.append(to_afm_row(task, prompts.get(task.profile, ""), split))
    return rows


def save_afm_parquet(tasks: Iterable[Task], path: str | Path,
                     system_prompt_for: Callable[[str], str] = coa_system_prompt, split: str = "test") -> Path:
    """Write tasks as one AFM RL parquet file; ValueError names the task that cannot be written."""
    import pyarrow as pa  # lazy: only parquet users pay for the import
    import pyarrow.parquet as pq

    rows = to_afm_rows(tasks, system_prompt_for, split)
    if not rows:
        raise ValueError(f"{path}: no tasks to write")
    kinds = {"mhqa" if isinstance(r["reward_model"]["ground_truth"], dict) else "string" for r in rows}
    if len(kinds) > 1:
        raise ValueError(f"{path}: MHQA tasks (ground_truth {{'target': [...]}}) and math/code tasks "
                         "(ground_truth string) need separate files")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
