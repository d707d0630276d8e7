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
humaneval   task_id, prompt, entry_point, test                         code
mbpp        task_id, code + text/test_list or prompt/test  (MBPP)       code
apps        description, test_list, starter_code  (APPS stdin/stdout)   code
aime        Question, Solution, answer  (SimpleDeepSearcher AIME)       math
bamboogle   Question, answer, source  (SimpleDeepSearcher Bamboogle)    mhqa
gaia        task_id, question, answer, Level  (GAIA, AFM copy)           web
webwalker   question, answer, root_url  (WebWalkerQA)                   web
qa          question + a single answer string (R1-Searcher eval sets)   mhqa
==========  ==========================================================  =========

Code layouts put their tests in ``metadata["tests"]`` (schema: :mod:`coa_lab.tasks.records`).

File formats: ``.jsonl`` / ``.jsonl.gz`` (one object per line), ``.json`` (a list of
objects), ``.parquet``.  Any row that cannot be read raises :class:`DatasetError` naming
the file, the 1-based row number and the problem; a file whose layout is unknown raises
one naming the keys it saw.  The shipped suites (``load_suite``) are in
:mod:`coa_lab.tasks.suites`.
"""

from __future__ import annotations

import gzip
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from coa_lab.tasks import code_layouts
from coa_lab.tasks.records import DatasetError, Task, check_tests
from coa_lab.tasks.rows import literal as _literal
from coa_lab.tasks.rows import str_list as _str_list
from coa_lab.tasks.rows import text as _text

MHQA_SOURCES = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "2wiki", "musique", "bamboogle")


# --------------------------------------------------------------------------- reading rows
@dataclass
class _InvalidLine:
    """A JSON-lines row that is not JSON (its DatasetError message)."""

    message: str


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
                except (json.JSONDecodeError, RecursionError) as exc:
                    # handed on, not raised: the reader decides whether one bad line stops the file
                    what = f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
                    yield lineno, _InvalidLine(f"{path}: row {lineno}: invalid JSON ({what})")
        return
    raise DatasetError(f"{path}: unsupported file type (use .jsonl, .jsonl.gz, .json or .parquet)")


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
    task = Task.from_dict(row)
    if task.profile == "code":
        task.metadata["tests"] = check_tests(task.metadata.get("tests"))
    return task


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
    messages = _literal(row["prompt"])
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
        meta["tests"] = code_layouts.afm_code_tests(truth, extra if isinstance(extra, dict) else {})
        if isinstance(extra, dict) and extra.get("starter_code"):
            meta["starter_code"] = extra["starter_code"]
    else:
        profile = "mhqa" if data_source.lower() in MHQA_SOURCES else "math"
        raw = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
        if isinstance(truth, dict) and "target" in truth:  # Search-R1 style {"target": [...]}
            truth = truth["target"]
        if truth is None:
            raise ValueError("'reward_model.ground_truth' is missing")
        if profile == "math" and isinstance(raw, str):
            answers = [raw]  # a math answer is ONE expression: "(-2,1)" is not a Python tuple
        else:
            answers = _str_list(truth, "'reward_model.ground_truth'")
    index = extra.get("index", i) if isinstance(extra, dict) else i
    return Task(f"{data_source}-{index}", question, answers, data_source, profile, meta)


def _parse_aime(row: dict, path: Path, i: int) -> Task:
    if row.get("answer") is None:
        raise ValueError("missing 'answer'")
    source = path.parent.name.lower() or "aime"
    return Task(f"{source}-{row.get('id', i)}", _text(row, "Question"), [str(row["answer"])], source, "math",
                {"solution": row.get("Solution")})


def _parse_bamboogle(row: dict, path: Path, i: int) -> Task:
    source = str(row.get("source") or "bamboogle").lower()
    number = str(row.get("id", i)).removeprefix(f"{source}_")
    return Task(f"{source}-{number}", _text(row, "Question"), _str_list(row["answer"], "'answer'"), source, "mhqa", {})


def _parse_gaia(row: dict, path: Path, i: int) -> Task:
    if row.get("answer") is None:
        raise ValueError("missing 'answer'")
    meta = {"level": row.get("Level"), "file_name": row.get("file_name") or None}
    return Task(f"gaia-{row['task_id']}", _text(row, "question"), [str(row["answer"])], "gaia", "web", meta)


def _parse_webwalker(row: dict, path: Path, i: int) -> Task:
    info = _literal(row.get("info")) or {}
    info = info if isinstance(info, dict) else {}
    meta = {"root_url": row["root_url"], **{k.lower(): info[k] for k in ("domain", "type", "Level", "lang") if k in info}}
    # WebWalkerQA rows have no id; the 0-based row index is stable for a given file.
    return Task(f"webwalker-{row.get('id', i)}", _text(row, "question"), _str_list(row["answer"], "'answer'"),
                "webwalker", "web", meta)


def _parse_qa(row: dict, path: Path, i: int) -> Task:
    source = _mhqa_source(path, row, default=path.name.split(".")[0].split("_")[0])
    task_id = row.get("id", row.get("idx", i))
    return Task(f"{source}-{task_id}", _text(row, "question"), _str_list(row["answer"], "'answer'"), source, "mhqa", {})


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
    _Layout("humaneval", _has("task_id", "prompt", "entry_point", "test"), code_layouts.parse_humaneval),
    _Layout("mbpp", lambda r: _has("task_id", "code")(r) and (_has("text", "test_list")(r) or _has("prompt", "test")(r)),
            code_layouts.parse_mbpp),
    _Layout("apps", _has("description", "test_list", "starter_code"), code_layouts.parse_apps),
    _Layout("aime", _has("Question", "Solution", "answer"), _parse_aime),
    _Layout("bamboogle", _has("Question", "answer", "source"), _parse_bamboogle),
    _Layout("gaia", _has("task_id", "question", "answer", "Level"), _parse_gaia),
    _Layout("webwalker", _has("question", "answer", "root_url"), _parse_webwalker),
    # Last: the loosest signature (any question with one answer string).
    _Layout("qa", lambda r: _has("question", "answer")(r) and "####" not in str(r["answer"]), _parse_qa),
)


def detect_layout(row: dict) -> str | None:
    """Name of the layout ``row`` looks like, or None."""
    for layout in LAYOUTS:
        if layout.detect(row):
            return layout.name
    return None


# --------------------------------------------------------------------------- public API
class BadRowsSkipped(UserWarning):
    """Issued by ``load_tasks(..., skip_bad_rows=True)``: how many rows were skipped, and why."""


def load_tasks(path: str | Path, limit: int | None = None,
               where: Callable[[dict], bool] | None = None, skip_bad_rows: bool = False,
               skipped: list[str] | None = None) -> list[Task]:
    """Read up to ``limit`` tasks from ``path`` (layout detected from its first row).

    ``where`` filters raw rows before parsing (e.g. keep only stdin/stdout APPS problems);
    row numbers in errors and 0-based indices in ids still count every row of the file.
    A row that cannot become a Task raises DatasetError naming the file and the row; with
    ``skip_bad_rows`` (large third-party dumps) it is skipped instead, its reason appended to
    ``skipped`` if given, and one BadRowsSkipped warning gives the count and the first reasons.
    """
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: no such file")
    layout: _Layout | None = None
    tasks: list[Task] = []
    reasons: list[str] = []
    for index, (rowno, row) in enumerate(_iter_rows(path)):
        if limit is not None and len(tasks) >= limit:
            break
        try:
            if isinstance(row, _InvalidLine):
                raise DatasetError(row.message)
            if not isinstance(row, dict):
                raise DatasetError(f"{path}: row {rowno}: expected an object, got {type(row).__name__}")
            if layout is None:
                layout = next((lay for lay in LAYOUTS if lay.detect(row)), None)
                if layout is None:
                    raise DatasetError(
                        f"{path}: unknown task layout; row {rowno} has keys {sorted(row)}; "
                        f"known layouts: {[lay.name for lay in LAYOUTS]} (see coa_lab.tasks.loaders)"
                    )
            if where is not None and not where(row):
                continue
            tasks.append(_parse_row(layout, row, path, index, rowno))
        except DatasetError as exc:
            if not skip_bad_rows or (layout is None and isinstance(row, dict)):
                raise  # the first object's layout is unknown: nothing in this file is readable
            reasons.append(str(exc))
    if reasons:
        if skipped is not None:
            skipped.extend(reasons)
        first = "; ".join(r.removeprefix(f"{path}: ") for r in reasons[:3])
        warnings.warn(f"{path}: skipped {len(reasons)} bad row(s), kept {len(tasks)}; first: {first}",
                      BadRowsSkipped, stacklevel=2)
    return tasks


def _parse_row(layout: _Layout, row: dict, path: Path, index: int, rowno: int) -> Task:
    """One row through its layout's parser; ANY failure becomes a DatasetError naming the file
    and the row (a parser meeting a shape nobody anticipated must not take a loader down
    with a bare TypeError, or worse, an exception from deep inside ast)."""
    try:
        return layout.parse(row, path, index)
    except KeyError as exc:
        raise DatasetError(f"{path}: row {rowno} ({layout.name} layout): missing {exc.args[0]!r}") from exc
    except (ValueError, TypeError, IndexError, AttributeError) as exc:
        raise DatasetError(f"{path}: row {rowno} ({layout.name} layout): {exc}") from exc
    except (RecursionError, MemoryError, OverflowError) as exc:
        raise DatasetError(f"{path}: row {rowno} ({layout.name} layout): {type(exc).__name__} "
                           f"(a value nested or sized beyond what the parser handles)") from exc


def layout_of(path: str | Path) -> str:
    """Name of the layout of ``path`` (from its first row); DatasetError if unknown."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: no such file")
    for rowno, row in _iter_rows(path):
        if isinstance(row, _InvalidLine):
            raise DatasetError(row.message)
        name = detect_layout(row) if isinstance(row, dict) else None
        if name is None:
            keys = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise DatasetError(f"{path}: unknown task layout; row {rowno} has keys {keys}")
        return name
    raise DatasetError(f"{path}: file holds no rows")

