"""load_tasks: layout detection, clear errors on broken rows, and the shipped suites."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from coa_lab.tasks import DatasetError, Task, detect_layout, load_suite, load_tasks, suite_files, suite_path

SHARED = Path("/work/shared/datasets")


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


GSM8K_ROW = {"question": "Janet has 3 apples and buys 2. How many?", "answer": "3 + 2 = <<3+2=5>>5\n#### 5"}
IRCOT_ROW = {
    "question_id": "5a8c", "question_text": "Who?",
    "answers_objects": [{"number": "", "date": {"day": "", "month": "", "year": ""}, "spans": ["Shirley Temple"]}],
    "contexts": [{"id": "0", "title": "Shirley Temple", "paragraph_text": "Shirley ...", "is_supporting": True},
                 {"id": "1", "title": "Other", "paragraph_text": "...", "is_supporting": False}],
}
HOTPOT_ROW = {
    "_id": "5a77", "question": "If Gallu is a demon Lilu is what?", "answer": "a spirit", "type": "bridge",
    "level": "easy", "supporting_facts": [["Lilu (mythology)", 0], ["Alû", 3]],
    "context": [["Lilu (mythology)", ["Lilu is a spirit.", " More."]], ["Alû", ["Alû is a demon."]]],
}
MATH500_ROW = {"problem": "What is $1/2 + 1/2$?", "solution": "...", "answer": "1", "subject": "Algebra",
               "level": 1, "unique_id": "test/algebra/1.json"}


def test_gsm8k_layout(tmp_path):
    tasks = load_tasks(_write_jsonl(tmp_path / "test.jsonl", [GSM8K_ROW, GSM8K_ROW]))
    assert [t.id for t in tasks] == ["gsm8k-test-0", "gsm8k-test-1"]
    assert tasks[0].answers == ["5"] and tasks[0].profile == "math" and "<<3+2=5>>" in tasks[0].metadata["solution"]


def test_hotpotqa_both_layouts(tmp_path):
    ircot = load_tasks(_write_jsonl(tmp_path / "dev_subsampled.jsonl", [IRCOT_ROW]))[0]
    assert (ircot.id, ircot.answers, ircot.profile) == ("hotpotqa-5a8c", ["Shirley Temple"], "mhqa")
    assert ircot.metadata["supporting_titles"] == ["Shirley Temple"]
    (tmp_path / "hotpotqa_train.json").write_text(json.dumps([HOTPOT_ROW]), encoding="utf-8")
    orig = load_tasks(tmp_path / "hotpotqa_train.json")[0]
    assert (orig.id, orig.answers, orig.source) == ("hotpotqa-5a77", ["a spirit"], "hotpotqa")
    assert orig.metadata["supporting_titles"] == ["Lilu (mythology)", "Alû"]


def test_math500_and_gzip(tmp_path):
    path = tmp_path / "math500" / "test.jsonl.gz"
    path.parent.mkdir()
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write(json.dumps(MATH500_ROW) + "\n")
    task = load_tasks(path)[0]
    assert (task.id, task.source, task.answers) == ("math500-test/algebra/1.json", "math500", ["1"])


def test_afm_parquet_layout(tmp_path):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    content = "Solve the given task step by step. ...rules...\n\nTask:\nWhat is 2+2?"
    table = pa.Table.from_pylist([{
        "data_source": "MATH500", "prompt": [{"content": content, "role": "user"}], "ability": "fact-reasoning",
        "reward_model": {"ground_truth": "4", "style": "rule"}, "extra_info": {"index": "7", "split": "test"},
    }])
    pq.write_table(table, tmp_path / "math500.parquet")
    task = load_tasks(tmp_path / "math500.parquet")[0]
    assert (task.id, task.question, task.answers, task.profile) == ("MATH500-7", "What is 2+2?", ["4"], "math")
    assert "Task:" in task.metadata["afm_prompt"]


def test_nq_layouts(tmp_path):
    rows = [{"id": "test_1", "question": "who?", "golden_answers": ["Jesus Christ", "Jesus"]}]
    task = load_tasks(_write_jsonl(tmp_path / "nq_test_sub1000.jsonl", rows))[0]
    assert (task.id, task.answers, task.profile) == ("nq-test_1", ["Jesus Christ", "Jesus"], "mhqa")
    rows = [{"question": "who?", "answer": ["Röntgen"], "data_source": "nq"}]
    assert load_tasks(_write_jsonl(tmp_path / "nq_full.jsonl", rows))[0].answers == ["Röntgen"]


def test_shipped_layout_roundtrip(tmp_path):
    task = Task("x-1", "q?", ["a"], "src", "mhqa", {"k": 1})
    assert load_tasks(_write_jsonl(tmp_path / "t.jsonl", [task.to_dict()])) == [task]
    assert detect_layout(task.to_dict()) == "task"


def test_limit(tmp_path):
    assert len(load_tasks(_write_jsonl(tmp_path / "train.jsonl", [GSM8K_ROW] * 5), limit=2)) == 2


def test_bad_json_line_names_file_and_row(tmp_path):
    path = _write_jsonl(tmp_path / "train.jsonl", [GSM8K_ROW, GSM8K_ROW, '{"question": "broken'])
    with pytest.raises(DatasetError, match=r"train\.jsonl: row 3: invalid JSON"):
        load_tasks(path)


def test_missing_question_names_row(tmp_path):
    path = _write_jsonl(tmp_path / "train.jsonl", [GSM8K_ROW, {"answer": "#### 4"}])
    with pytest.raises(DatasetError, match=r"train\.jsonl: row 2 \(gsm8k layout\): missing 'question'"):
        load_tasks(path)


def test_missing_final_answer_names_row(tmp_path):
    path = _write_jsonl(tmp_path / "train.jsonl", [GSM8K_ROW, {"question": "q", "answer": "no marker"}])
    with pytest.raises(DatasetError, match=r"row 2 .*####"):
        load_tasks(path)


def test_unknown_layout_names_keys(tmp_path):
    path = _write_jsonl(tmp_path / "odd.jsonl", [{"foo": 1, "bar": 2}])
    with pytest.raises(DatasetError, match=r"odd\.jsonl: unknown task layout.*\['bar', 'foo'\]"):
        load_tasks(path)


def test_non_object_row(tmp_path):
    with pytest.raises(DatasetError, match="row 1: expected an object"):
        load_tasks(_write_jsonl(tmp_path / "x.jsonl", [[1, 2]]))


def test_load_suite_shipped_sizes():
    assert len(load_suite("math", "train")) == 500
    assert len(load_suite("math", "eval")) == 200 + 500 + 30 + 40  # gsm8k, math500, aime24, amc23
    assert len(load_suite("math", "eval", benchmark="gsm8k")) == 200
    assert len(load_suite("math", "eval", benchmark="math500")) == 500
    assert len(load_suite("mhqa", "train")) == 400
    assert len(load_suite("mhqa", "eval")) == 400  # hotpotqa + 2wiki (answerable from the corpus)
    assert len(load_suite("mhqa", "eval", limit=5)) == 5
    assert len(load_suite("mhqa", "eval", limit=250)) == 250  # limit spans files
    assert len(load_suite("code", "train")) == 374
    assert len(load_suite("code", "eval")) == 164 + 500 + 49 + 100
    assert len(load_suite("web", "eval")) == 103 + 680
    with pytest.raises(ValueError, match="unknown suite"):
        load_suite("chess", "eval")
    with pytest.raises(ValueError, match="unknown split"):
        load_suite("math", "dev")
    with pytest.raises(ValueError, match="no eval benchmark 'gsm9k'.*math500"):
        load_suite("math", "eval", benchmark="gsm9k")
    with pytest.raises(DatasetError, match="no train split"):
        load_suite("web", "train")


def test_load_suite_val_and_test_splits():
    # "test" is what "eval" was, except the learnable families now point at their test files
    for name in ("math", "mhqa", "code", "web"):
        assert suite_files(name, "test") == suite_files(name, "eval")
    assert suite_path("math", "eval", benchmark="arith").name == "test.jsonl"
    assert suite_path("mhqa", "eval", benchmark="lookup").name == "test.jsonl"
    # the families' test files hold the selection split ("test") and the confirmation split, by id
    assert len(load_suite("math", "test", benchmark="arith")) == 144
    assert len(load_suite("mhqa", "test", benchmark="lookup")) == 48
    assert len(load_suite("math", "confirm", benchmark="arith")) == 336
    assert len(load_suite("mhqa", "confirm", benchmark="lookup")) == 72
    assert [t.id for t in load_suite("math", "confirm")] == [t.id for t in load_suite("math", "confirm", benchmark="arith")]
    for name in ("code", "web"):
        with pytest.raises(DatasetError, match="no confirmation split"):
            load_suite(name, "confirm")
    # val: only the learnable families, and they are the default
    assert [t.id for t in load_suite("math", "val")] == [t.id for t in load_suite("math", "val", benchmark="arith")]
    assert len(load_suite("math", "val")) == 240 and load_suite("math", "val")[0].id == "arith-val-0"
    assert len(load_suite("mhqa", "val")) == 201 and load_suite("mhqa", "val")[0].id == "lookup-val-0"
    for name in ("code", "web"):
        with pytest.raises(DatasetError, match="no validation split"):
            load_suite(name, "val")
    with pytest.raises(DatasetError, match="no validation split"):
        load_suite("code", "val", benchmark="mbpp")
    with pytest.raises(ValueError, match="no val benchmark 'gsm8k'"):
        load_suite("math", "val", benchmark="gsm8k")  # tuning happens on the families, not the benchmarks


@pytest.mark.skipif(not SHARED.exists(), reason="source checkout /work/shared not available")
@pytest.mark.parametrize("rel, n", [
    ("math/gsm8k/test.jsonl", 1319), ("math/math500/test.jsonl", 500), ("afm_benchmarks/math500.parquet", 500),
    ("afm_benchmarks/aime24.parquet", 30), ("mhqa/hotpotqa_dev_ircot500/dev_subsampled.jsonl", 500),
    ("mhqa/hotpotqa_train_hipporag100/hotpotqa_train.json", 100), ("afm_benchmarks/nq_full.jsonl", 3610),
    ("afm_benchmarks/amc23.parquet", 40), ("afm_benchmarks/livecodebench_v4.parquet", 100),
    ("afm_benchmarks/gaia_dev_103.json", 103), ("afm_benchmarks/webwalker_main.json", 680),
    ("math/aime2024/aime.json", 30), ("math/aime2024/aime24_test.jsonl", 30), ("math/amc23/test.jsonl", 40),
    ("code/humaneval/HumanEval.jsonl.gz", 164), ("code/mbpp/mbpp.jsonl", 974), ("code/mbpp/mbpp_test.jsonl", 500),
    ("mhqa/2wikimultihopqa_dev/2wiki_dev500_with_context.jsonl", 500), ("mhqa/musique_train_hipporag100/musique_train.json", 100),
    ("mhqa/bamboogle/bamboogle.json", 125), ("mhqa/r1searcher_evalsets/musique_500.jsonl", 500),
    ("mhqa/nq_triviaqa_popqa_subsets/popqa_test_sub1000.jsonl", 1000),
])
def test_real_source_files(rel, n):
    assert len(load_tasks(SHARED / rel)) == n
