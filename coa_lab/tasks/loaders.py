"""Read task files of many public layouts into :class:`~coa_lab.tasks.records.Task` lists.

``load_tasks(path)`` looks at the keys of the first row and picks a layout:

==========  ==========================================================  =========
layout      recognised by (keys of the first row)                       profile
==========  ==========================================================  =========
task        id, question, answers, profile  (what datasets/ ships)       from row
afm         data_source, prompt, reward_model  (AFM / verl parquet)      math/code/mhqa
ircot       question_id, question_text, answers_objects                 mhqa
hotpotqa    _id, question, answer  (HotpotQA / 2Wiki original)          mhqa
gsm8k       question, answer  with "#### <answer>" in answer            math
math        problem, answer  (MATH-500, AIME, AMC jsonl)                 math
nq          question + golden_answers (FlashRAG), or answer as a list   mhqa
aliases     id, question, answer, answer_aliases  (MuSiQue, 2Wiki)      mhqa
==========  ==========================================================  =========

File formats: ``.jsonl`` / ``.jsonl.gz`` (one object per line), ``.json`` (a list of
objects), ``.parquet``.  Any row that cannot be read raises :class:`DatasetError` naming
the file, the 1-based row number and the problem; a file whose layout is unknown raises
one naming the keys it saw.  ``load_suite`` reads the lab's shipped train/eval files.
"""

from __future__ import annotations

import ast
import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from coa_lab.paths import DATASETS_DIR
from coa_lab.tasks.records import DatasetError, Task

MHQA_SOURCES = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "2wiki", "musique", "bamboogle")

SUITES: dict[str, str] = {"math": "math/gsm8k", "mhqa": "mhqa/hotpotqa"}
SPLITS = ("train", "eval")


# --------------------------------------------------------------------------- reading rows
def _iter_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield (1-based row number, parsed row).  For JSON lines the row number is the line."""
    name = path.name.lower()
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq  # lazy: only parquet users pay for the import

        # to_pylist gives plain lists/dicts, not the numpy arrays pandas would hand us.
        for i, row in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield i, row
        return
    if name.endswith(".json"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}: invalid JSON ({exc})") from exc
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list):
            raise DatasetError(f"{path}: expected a JSON list of rows, got {type(data).__name__}")
        yield from enumerate(data, start=1)
        return
    if name.endswith(".jsonl") or name.endswith(".jsonl.gz"):
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    yield lineno, json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DatasetError(f"{path}: row {lineno}: invalid JSON ({exc.msg} at column {exc.colno})") from exc
        return
    raise DatasetError(f"{path}: unsupported file type (use .jsonl, .jsonl.gz, .json or .parquet)")


def _literal(value: Any) -> Any:
    # Several public dumps store lists/dicts as Python-repr strings ("['a', 'b']").
    if isinstance(value, str) and value[:1] in "[{(":
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
    return value


def _str_list(value: Any, what: str) -> list[str]:
    value = _literal(value)
    if isinstance(value, (str, int, float)):
        return [str(value)]
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float)) for v in value):
        return [str(v) for v in value]
    raise ValueError(f"{what} must be a string or a list of strings, got {type(value).__name__}")


def _text(row: dict, key: str) -> str:
    if key not in row:
        raise ValueError(f"missing {key!r}")
    value = row[key]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{key!r} must be a non-empty string")
    return value


def _mhqa_source(path: Path, row: dict, default: str = "hotpotqa") -> str:
    # Most specific hint first: a row's data_source, then the file name, then its folders
    # (a folder like "nq_triviaqa_popqa_subsets" names several datasets at once).
    for hint in (str(row.get("data_source") or ""), path.name, str(path.parent)):
        hint = hint.lower()
        for name in ("2wiki", "musique", "bamboogle", "hotpotqa", "triviaqa", "popqa", "nq"):
            if name in hint:
                return "2wikimultihopqa" if name == "2wiki" else name
    return default


# --------------------------------------------------------------------------- layouts
@dataclass(frozen=True)
class _Layout:
    name: str
    detect: Callable[[dict], bool]
    parse: Callable[[dict, Path, int], Task]  # (row, file, 0-based data index)


def _parse_task(row: dict, path: Path, i: int) -> Task:
    return Task.from_dict(row)


def _parse_gsm8k(row: dict, path: Path, i: int) -> Task:
    answer = _text(row, "answer")
    if "####" not in answer:
        raise ValueError("'answer' has no '#### <final answer>' line")
    rationale, _, final = answer.rpartition("####")
    if not final.strip():
        raise ValueError("empty final answer after '####'")
    # Same id scheme as datasets/math/gsm8k and ToRA's "idx": split name + 0-based row.
    return Task(f"gsm8k-{path.name.split('.')[0]}-{i}", _text(row, "question"), [final.strip()],
                "gsm8k", "math", {"solution": rationale.strip()})


def _parse_math(row: dict, path: Path, i: int) -> Task:
    if row.get("answer") is None:
        raise ValueError("missing 'answer'")
    source = path.parent.name.lower() or "math"
    task_id = row.get("unique_id") or row.get("id")
    task_id = i if task_id is None else task_id
    meta = {k: row[k] for k in ("solution", "level", "subject", "unique_id") if k in row}
    return Task(f"{source}-{task_id}", _text(row, "problem"), [str(row["answer"])], source, "math", meta)


def _parse_hotpotqa(row: dict, path: Path, i: int) -> Task:
    source = "2wikimultihopqa" if ("evidences" in row or "2wiki" in str(path).lower()) else "hotpotqa"
    meta: dict[str, Any] = {k: row[k] for k in ("type", "level") if k in row}
    if "supporting_facts" in row:
        facts = _literal(row["supporting_facts"])
        meta["supporting_titles"] = list(dict.fromkeys(f[0] if isinstance(f, (list, tuple)) else f for f in facts))
    if "context" in row:
        meta["context"] = [[t, list(s)] for t, s in _literal(row["context"])]
    return Task(f"{source}-{row['_id']}", _text(row, "question"), _str_list(row["answer"], "'answer'"), source, "mhqa", meta)


def _parse_ircot(row: dict, path: Path, i: int) -> Task:
    answers: list[str] = []
    for obj in row["answers_objects"]:
        answers += [s for s in obj.get("spans", []) if s]
        if obj.get("number"):
            answers.append(str(obj["number"]))
    if not answers:
        raise ValueError("'answers_objects' holds no answer span")
    contexts = row.get("contexts") or []
    meta = {
        "supporting_titles": [c["title"] for c in contexts if str(c.get("is_supporting")) == "True"],
        "context": [[c["title"], c["paragraph_text"]] for c in contexts],
    }
    source = _mhqa_source(path, row)
    return Task(f"{source}-{row['question_id']}", _text(row, "question_text"), answers, source, "mhqa", meta)


def _parse_nq(row: dict, path: Path, i: int) -> Task:
    golds = row["golden_answers"] if "golden_answers" in row else row["answer"]
    source = _mhqa_source(path, row, default=path.name.split(".")[0])
    task_id = row.get("id", row.get("idx", i))
    return Task(f"{source}-{task_id}", _text(row, "question"), _str_list(golds, "answers"), source, "mhqa", {})


def _parse_aliases(row: dict, path: Path, i: int) -> Task:
    answers = _str_list(row["answer"], "'answer'") + _str_list(row.get("answer_aliases") or [], "'answer_aliases'")
    source = _mhqa_source(path, row, default=path.name.split(".")[0])
    return Task(f"{source}-{row['id']}", _text(row, "question"), list(dict.fromkeys(answers)), source, "mhqa", {})


def _parse_afm(row: dict, path: Path, i: int) -> Task:
    messages = row["prompt"]
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        raise ValueError("'prompt' must be a non-empty list of chat messages")
    content = str(messages[-1].get("content") or "")
    # AFM prompts are "<long tool/format instructions>\n\nTask:\n<question>"; the
    # instructions are ours to choose, so only the question becomes Task.question.
    question = content.rsplit("Task:", 1)[1].strip() if "Task:" in content else content.strip()
    reward_model = _literal(row["reward_model"]) or {}
    truth = _literal(reward_model.get("ground_truth")) if isinstance(reward_model, dict) else None
    data_source = str(row.get("data_source") or "afm")
    extra = _literal(row.get("extra_info")) or {}
    meta: dict[str, Any] = {"data_source": data_source, "ability": row.get("ability"), "afm_prompt": content}
    if row.get("ability") == "coding" or "code" in data_source.lower():
        profile, answers = "code", []
        meta["tests"] = truth  # stdin/expected_output JSON; graded by the code sandbox
    else:
        if isinstance(truth, dict) and "target" in truth:  # Search-R1 style {"target": [...]}
            truth = truth["target"]
        if truth is None:
            raise ValueError("'reward_model.ground_truth' is missing")
        answers = _str_list(truth, "'reward_model.ground_truth'")
        profile = "mhqa" if data_source.lower() in MHQA_SOURCES else "math"
    index = extra.get("index", i) if isinstance(extra, dict) else i
    return Task(f"{data_source}-{index}", question, answers, data_source, profile, meta)


def _has(*keys: str) -> Callable[[dict], bool]:
    return lambda row: all(k in row for k in keys)


# Order matters: the most specific signatures first (a shipped task row also has
# "question", a HotpotQA row also has "question"+"answer").
LAYOUTS: tuple[_Layout, ...] = (
    _Layout("task", _has("id", "question", "answers", "profile"), _parse_task),
    _Layout("afm", _has("data_source", "prompt", "reward_model"), _parse_afm),
    _Layout("ircot", _has("question_id", "question_text", "answers_objects"), _parse_ircot),
    _Layout("hotpotqa", _has("_id", "question", "answer"), _parse_hotpotqa),
    _Layout("gsm8k", lambda r: _has("question", "answer")(r) and "####" in str(r["answer"]), _parse_gsm8k),
    _Layout("math", _has("problem", "answer"), _parse_math),
    _Layout("nq", lambda r: "question" in r and ("golden_answers" in r or isinstance(r.get("answer"), list)), _parse_nq),
    _Layout("aliases", _has("id", "question", "answer", "answer_aliases"), _parse_aliases),
)


def detect_layout(row: dict) -> str | None:
    """Name of the layout ``row`` looks like, or None."""
    for layout in LAYOUTS:
        if layout.detect(row):
            return layout.name
    return None


# --------------------------------------------------------------------------- public API
def load_tasks(path: str | Path, limit: int | None = None) -> list[Task]:
    """Read up to ``limit`` tasks from ``path`` (layout detected from its first row)."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: no such file")
    layout: _Layout | None = None
    tasks: list[Task] = []
    for index, (rowno, row) in enumerate(_iter_rows(path)):
        if limit is not None and len(tasks) >= limit:
            break
        if not isinstance(row, dict):
            raise DatasetError(f"{path}: row {rowno}: expected an object, got {type(row).__name__}")
        if layout is None:
            layout = next((lay for lay in LAYOUTS if lay.detect(row)), None)
            if layout is None:
                raise DatasetError(
                    f"{path}: unknown task layout; row {rowno} has keys {sorted(row)}; "
                    f"known layouts: {[lay.name for lay in LAYOUTS]} (see coa_lab.tasks.loaders)"
                )
        try:
            tasks.append(layout.parse(row, path, index))
        except (KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
            what = f"missing {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
            raise DatasetError(f"{path}: row {rowno} ({layout.name} layout): {what}") from exc
    return tasks


def suite_path(name: str, split: str) -> Path:
    """Path of a shipped suite file, e.g. ``suite_path("math", "eval")``."""
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; choose one of {sorted(SUITES)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    return DATASETS_DIR / SUITES[name] / f"{split}.jsonl"


def load_suite(name: str, split: str, limit: int | None = None) -> list[Task]:
    """Shipped tasks: ``name`` in {"math", "mhqa"}, ``split`` in {"train", "eval"}."""
    path = suite_path(name, split)
    if not path.exists():
        raise DatasetError(f"{path}: shipped suite file missing (rebuild with datasets/build_corpus.py "
                           "and datasets/build_subsets.py, or set COA_LAB_DATASETS)")
    return load_tasks(path, limit=limit)
