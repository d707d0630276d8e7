"""load_tasks on the code, web and remaining QA layouts, with broken rows named by file and row."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from coa_lab.tasks import DatasetError, detect_layout, layout_of, load_tasks

SHARED = Path("/work/shared/datasets")


def _jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


HUMANEVAL = {"task_id": "HumanEval/3", "prompt": "def f(x):\n    \"\"\"Double.\"\"\"\n", "entry_point": "f",
             "canonical_solution": "    return 2 * x\n", "test": "def check(candidate):\n    assert candidate(1) == 2\n"}
MBPP = {"task_id": 11, "text": "Write f.", "code": "def f(x):\r\n    return 2 * x", "test_setup_code": "",
        "test_list": ["assert f(1) == 2", "assert f(2) == 4"], "challenge_test_list": []}
MBPP_DS = {"task_id": "12", "prompt": "Write g.", "code": "def g():\n    return 1", "test": "['assert g() == 1']"}
APPS = {"id": "7", "name": "7", "description": "Print n+1.", "difficulty": "interview", "starter_code": "",
        "sample_io": [], "test_list": [{"input": "1\n", "output": ["2\n"]}, {"input": "5\n", "output": ["6", "x"]}]}
GAIA = {"id": "1", "task_id": "abc-1", "question": "How many?", "answer": "34689", "Level": "2", "Annotator_Metadata": "{}"}
WEBWALKER = {"question": "Who funds it?", "answer": "EU4Health.", "root_url": "https://x.org/",
             "info": "{'domain': 'conference', 'type': 'single_source', 'Level': 'medium', 'lang': 'en', 'golden_path': []}"}
BAMBOOGLE = {"Question": "Who was president?", "source": "bamboogle", "id": "bamboogle_4", "answer": "['james madison']"}
AIME = {"id": "0", "Question": "Find x.", "Solution": "x = 204", "answer": "204"}
R1 = {"idx": "9", "question": "What was he nominated for?", "answer": "Academy Award", "gen_text_store": ""}


def test_humaneval_layout(tmp_path):
    path = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write(json.dumps(HUMANEVAL) + "\n")
    task = load_tasks(path)[0]
    tests = task.metadata["tests"]
    assert (task.id, task.profile, task.answers, layout_of(path)) == ("humaneval-3", "code", [], "humaneval")
    assert tests["style"] == "assert" and tests["cases"][0].rstrip().endswith("check(f)")
    assert tests["entry_point"] == "f" and tests["prompt"] == HUMANEVAL["prompt"]
    assert task.metadata["canonical_solution"] == HUMANEVAL["prompt"] + HUMANEVAL["canonical_solution"]
    assert HUMANEVAL["prompt"] in task.question


def test_mbpp_both_layouts(tmp_path):
    task = load_tasks(_jsonl(tmp_path / "mbpp.jsonl", [MBPP]))[0]
    assert (task.id, task.metadata["tests"]["cases"]) == ("mbpp-11", MBPP["test_list"])
    assert "\r" not in task.metadata["canonical_solution"] and "assert f(1) == 2" in task.question
    task = load_tasks(_jsonl(tmp_path / "mbpp_test.jsonl", [MBPP_DS]))[0]
    assert (task.id, task.metadata["tests"]["cases"], task.profile) == ("mbpp-12", ["assert g() == 1"], "code")


def test_apps_stdio_layout_and_call_based_rejected(tmp_path):
    task = load_tasks(_jsonl(tmp_path / "selected150.jsonl", [APPS]))[0]
    assert task.id == "apps-7" and task.metadata["tests"]["style"] == "stdio"
    assert task.metadata["tests"]["cases"] == [{"input": "1\n", "output": "2\n"}, {"input": "5\n", "output": "6\nx\n"}]
    call_based = {**APPS, "starter_code": "def f(x):\n\t"}
    path = _jsonl(tmp_path / "apps.jsonl", [APPS, call_based])
    with pytest.raises(DatasetError, match=r"apps\.jsonl: row 2 \(apps layout\): call-based"):
        load_tasks(path)
    assert len(load_tasks(path, where=lambda r: not r["starter_code"])) == 1


def test_afm_code_parquet_tests_schema(tmp_path):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    base = {"data_source": "livecodebench", "prompt": [{"role": "user", "content": "rules\nTask: add"}], "ability": "coding"}
    rows = [
        {**base, "reward_model": {"ground_truth": json.dumps({"stdin": ["1 2\n"], "expected_output": ["3\n"]}), "style": "rule"},
         "extra_info": {"index": "a1", "starter_code": ""}},
        {**base, "reward_model": {"ground_truth": json.dumps({"functional": "assert Solution().f() == 1"}), "style": "rule"},
         "extra_info": {"index": "a2", "starter_code": "class Solution:\n    def f(self):\n"}},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "lcb.parquet")
    stdio, functional = load_tasks(tmp_path / "lcb.parquet")
    assert stdio.metadata["tests"]["cases"] == [{"input": "1 2\n", "output": "3\n"}]
    assert functional.metadata["tests"]["style"] == "assert" and "Solution()" in functional.metadata["tests"]["cases"][0]
    assert functional.metadata["starter_code"].startswith("class Solution")
    bad = [{**base, "reward_model": {"ground_truth": json.dumps({"stdin": ["1"], "expected_output": []})}, "extra_info": {"index": "b"}}]
    pq.write_table(pa.Table.from_pylist(bad), tmp_path / "bad.parquet")
    with pytest.raises(DatasetError, match=r"bad\.parquet: row 1 \(afm layout\): .*equal length"):
        load_tasks(tmp_path / "bad.parquet")


def test_web_layouts(tmp_path):
    (tmp_path / "gaia_dev_103.json").write_text(json.dumps([GAIA]), encoding="utf-8")
    gaia = load_tasks(tmp_path / "gaia_dev_103.json")[0]
    assert (gaia.id, gaia.profile, gaia.answers, gaia.metadata["level"]) == ("gaia-abc-1", "web", ["34689"], "2")
    (tmp_path / "webwalker_main.json").write_text(json.dumps([WEBWALKER, WEBWALKER]), encoding="utf-8")
    ww = load_tasks(tmp_path / "webwalker_main.json")
    assert [t.id for t in ww] == ["webwalker-0", "webwalker-1"] and ww[0].profile == "web"
    assert ww[0].metadata == {"root_url": "https://x.org/", "domain": "conference", "type": "single_source",
                              "level": "medium", "lang": "en"}


def test_bamboogle_aime_and_r1searcher_layouts(tmp_path):
    (tmp_path / "bamboogle.json").write_text(json.dumps([BAMBOOGLE]), encoding="utf-8")
    task = load_tasks(tmp_path / "bamboogle.json")[0]
    assert (task.id, task.answers, task.profile) == ("bamboogle-4", ["james madison"], "mhqa")
    (tmp_path / "aime2024").mkdir()
    (tmp_path / "aime2024" / "aime.json").write_text(json.dumps([AIME]), encoding="utf-8")
    task = load_tasks(tmp_path / "aime2024" / "aime.json")[0]
    assert (task.id, task.answers, task.profile) == ("aime2024-0", ["204"], "math")
    task = load_tasks(_jsonl(tmp_path / "musique_500.jsonl", [R1]))[0]
    assert (task.id, task.source, task.answers) == ("musique-9", "musique", ["Academy Award"])
    assert detect_layout(R1) == "qa" and detect_layout(AIME) == "aime" and detect_layout(BAMBOOGLE) == "bamboogle"


@pytest.mark.parametrize("rows, pattern", [
    ([HUMANEVAL, {**HUMANEVAL, "prompt": ""}], r"row 2 \(humaneval layout\): 'prompt' must be a non-empty string"),
    ([MBPP, {**MBPP, "test_list": []}], r"row 2 \(mbpp layout\): .*(no test|non-empty)"),
    ([MBPP, {k: v for k, v in MBPP.items() if k != "task_id"}], r"row 2 \(mbpp layout\): missing 'task_id'"),
    ([GAIA, {**GAIA, "question": ""}], r"row 2 \(gaia layout\): 'question' must be a non-empty string"),
    ([R1, {**R1, "answer": {"x": 1}}], r"row 2 \(qa layout\): 'answer' must be a string"),
    ([APPS, {**APPS, "test_list": "not a list"}], r"row 2 \(apps layout\): 'test_list' must be a list"),
])
def test_broken_rows_name_file_and_row(tmp_path, rows, pattern):
    path = _jsonl(tmp_path / "broken.jsonl", rows)
    with pytest.raises(DatasetError, match=r"broken\.jsonl: " + pattern):
        load_tasks(path)


def test_shipped_code_task_with_bad_tests_is_rejected(tmp_path):
    row = {"id": "c-1", "question": "q", "answers": [], "source": "x", "profile": "code",
           "metadata": {"tests": {"style": "stdio", "cases": [{"input": "1"}]}}}
    with pytest.raises(DatasetError, match=r"row 1 \(task layout\): tests.cases\[0\]"):
        load_tasks(_jsonl(tmp_path / "eval.jsonl", [row]))


@pytest.mark.skipif(not SHARED.exists(), reason="source checkout /work/shared not available")
def test_apps_source_file_filters_to_stdio():
    tasks = load_tasks(SHARED / "code/apps_selected150/selected150.jsonl", where=lambda r: not r["starter_code"].strip())
    assert len(tasks) == 52 and all(t.metadata["tests"]["style"] == "stdio" for t in tasks)
