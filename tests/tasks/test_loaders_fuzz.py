"""Loaders against every row a third-party file could hold: a row becomes a Task or a
DatasetError naming the file and the row — never another exception — and a legitimate answer
that merely parses as Python is kept as the string it is.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coa_lab.tasks.loaders import LAYOUTS, BadRowsSkipped, load_tasks
from coa_lab.tasks.records import DatasetError, Task
from coa_lab.tasks.rows import str_list

HLE_ANSWER = "(-0.5,0.87),(0,0),(0.37,1.37),(0.87,0.5)"  # row 118 of the AFM release's HLE test file


def _write(tmp_path, rows, name="data.json"):
    path = tmp_path / name
    if name.endswith(".jsonl"):
        path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    else:
        path.write_text(json.dumps(rows))
    return path


def test_hle_row_118_loads_with_its_answer_as_written(tmp_path):
    rows = [{"question": f"Question {i}?", "answer": str(i)} for i in range(1, 118)]
    rows.append({"question": "Give the four vertices.", "answer": HLE_ANSWER})
    rows += [{"question": "Q119?", "answer": "x"}, {"question": "Q120?", "answer": "y"}]
    tasks = load_tasks(_write(tmp_path, rows, "hle_test.json"))
    assert len(tasks) == 120
    assert tasks[117].answers == [HLE_ANSWER]


@pytest.mark.parametrize("value, expected", [
    ("['Paris', 'paris']", ["Paris", "paris"]),      # a repr-encoded list of answers: decoded
    ("[1, 2.5]", ["1", "2.5"]),
    ("[]", []),
    (["a", 3], ["a", "3"]),
    (7, ["7"]),
    (HLE_ANSWER, [HLE_ANSWER]),                      # parses as a tuple: kept as written
    ("(1, 2)", ["(1, 2)"]),                          # an interval, not a tuple
    ("{'a': 1}", ["{'a': 1}"]),
    ("[[1], 2]", ["[[1], 2]"]),                      # a list, but not of scalars
    ("[True]", ["[True]"]),
    ("[1, 2", ["[1, 2"]),                            # not Python at all
    ("[" * 500, ["[" * 500]),                        # nesting the parser refuses
])
def test_str_list_decodes_only_lists_of_scalars(value, expected):
    assert str_list(value, "'answer'") == expected


@pytest.mark.parametrize("value", [None, True, {"a": 1}, [["a"]], [None]])
def test_str_list_rejects_what_is_no_answer(value):
    with pytest.raises(ValueError, match="'answer' must be"):
        str_list(value, "'answer'")


# ----------------------------------------------------------------------- property tests

LITERAL_LOOKING = st.sampled_from([
    "[1, 2]", "['a', 'b']", "(1,2)", "{'a': 1}", "[" * 60, "[[1], 2]", HLE_ANSWER, "x #### 4",
    "[{'role': 'user', 'content': 'Task: add'}]", "{'ground_truth': '(1,2)'}", "{'ground_truth': ['a']}",
    "{'target': ['x']}", "[['Title', ['s1', 's2']]]", "assert f(1) == 2", "",
])
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | \
    st.text(max_size=20) | LITERAL_LOOKING
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.sampled_from(["role", "content", "ground_truth", "target", "spans", "number", "title", "paragraph_text",
                     "is_supporting", "index", "input", "output", "fn_name", "x"]) | st.text(max_size=6),
    inner, max_size=4), max_leaves=12)

# the keys each layout is detected by (coa_lab.tasks.loaders.LAYOUTS), plus keys parsers read
LAYOUT_KEYS = {
    "task": ["id", "question", "answers", "profile", "source", "metadata"],
    "afm": ["data_source", "prompt", "reward_model", "extra_info", "ability"],
    "ircot": ["question_id", "question_text", "answers_objects", "contexts"],
    "hotpotqa": ["_id", "question", "answer", "supporting_facts", "context", "type"],
    "gsm8k": ["question", "answer"],
    "math": ["problem", "answer", "unique_id", "solution"],
    "nq": ["question", "golden_answers", "id"],
    "aliases": ["id", "question", "answer", "answer_aliases"],
    "humaneval": ["task_id", "prompt", "entry_point", "test", "canonical_solution"],
    "mbpp": ["task_id", "code", "text", "test_list", "test_setup_code"],
    "apps": ["description", "test_list", "starter_code", "input_output"],
    "aime": ["Question", "Solution", "answer", "id"],
    "bamboogle": ["Question", "answer", "source", "id"],
    "gaia": ["task_id", "question", "answer", "Level", "file_name"],
    "webwalker": ["question", "answer", "root_url", "info"],
    "qa": ["question", "answer", "id"],
}
assert set(LAYOUT_KEYS) == {layout.name for layout in LAYOUTS}  # a new layout must be fuzzed too


@st.composite
def layout_rows(draw):
    name = draw(st.sampled_from(sorted(LAYOUT_KEYS)))
    keys = LAYOUT_KEYS[name]
    rows = []
    for _ in range(draw(st.integers(1, 3))):
        row = {k: draw(JSON) for k in keys if draw(st.booleans()) or k in keys[:3]}
        if name == "gsm8k" and draw(st.booleans()):
            row["answer"] = f"{draw(st.text(max_size=10))} #### {draw(st.text(max_size=5))}"
        rows.append(row)
    return name, rows


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(layout_rows(), st.sampled_from(["rows.jsonl", "rows.json"]))
def test_any_row_is_a_task_or_a_dataset_error_naming_file_and_row(tmp_path, case, name):
    _, rows = case
    path = _write(tmp_path, rows, name)
    try:
        tasks = load_tasks(path)
    except DatasetError as exc:
        assert str(path) in str(exc)
        assert "row " in str(exc) or "unknown task layout" in str(exc)
        return
    assert all(isinstance(t, Task) for t in tasks) and len(tasks) <= len(rows)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout_rows())
def test_skip_bad_rows_never_raises_once_a_layout_is_known(tmp_path, case):
    _, rows = case
    good = {"question": "What is 2 + 2?", "answer": "4"}
    path = _write(tmp_path, [good, *rows, "{not json", good], "rows.jsonl")
    skipped: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BadRowsSkipped)
        tasks = load_tasks(path, skip_bad_rows=True, skipped=skipped)
    assert len(tasks) + len(skipped) == len(rows) + 3
    assert all(str(path) in reason and "row " in reason for reason in skipped)


def test_skip_bad_rows_counts_and_names_the_first_reasons(tmp_path):
    rows = [{"question": "Q1?", "answer": "a"}, "{broken", {"question": "", "answer": "b"},
            {"question": "Q4?", "answer": {"nested": 1}}, {"question": "Q5?", "answer": "e"}]
    path = _write(tmp_path, rows, "third_party.jsonl")
    with pytest.raises(DatasetError, match=r"row 2: invalid JSON"):
        load_tasks(path)
    with pytest.warns(BadRowsSkipped, match=r"skipped 3 bad row\(s\), kept 2; first: row 2: invalid JSON"):
        tasks = load_tasks(path, skip_bad_rows=True)
    assert [t.question for t in tasks] == ["Q1?", "Q5?"]


def test_data_inspect_skip_bad_rows_from_the_shell(tmp_path):
    path = _write(tmp_path, [{"question": "Q1?", "answer": "a"}, "{broken", {"question": "Q3?", "answer": HLE_ANSWER}],
                  "dump.jsonl")
    cmd = [sys.executable, "-m", "coa_lab.cli", "data", "inspect", str(path)]
    plain = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert plain.returncode == 2 and "row 2: invalid JSON" in plain.stderr and "--skip-bad-rows" in plain.stderr
    skipping = subprocess.run(cmd + ["--skip-bad-rows"], capture_output=True, text=True, timeout=120)
    info = json.loads(skipping.stdout)
    assert info["rows"] == 2 and info["skipped_rows"] == 1 and "row 2" in info["first_skipped"][0]
