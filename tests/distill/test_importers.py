"""Importers: real FireAct / ToRA / R1-Searcher rows become well-formed CoA text; bad rows are skipped."""

from __future__ import annotations

import json

from coa_lab import protocol
from coa_lab.distill.importers import detect_trajectory_format, import_file, import_fireact, import_tora, load_imported
from coa_lab.paths import DATASETS_DIR
from coa_lab.tasks import Task, score

FIREACT_ROW = {"messages": [
    {"role": "user", "content": "In which game was Malcolm Smith named MVP?"},
    {"role": "assistant", "content": "Thought: I need to search Malcolm Smith MVP.\nAction: search[Malcolm Smith MVP]"},
    {"role": "user", "content": "Observation: Smith was named the MVP of Super Bowl XLVIII."},
    {"role": "assistant", "content": "Thought: It is Super Bowl XLVIII.\nAction: finish[Super Bowl XLVIII]"},
    {"role": "user", "content": "Observation: Episode finished, reward = True"},
]}
TORA_ROW = {"idx": 7, "question": "What is 6 times 7?", "gt": "42", "pred": ["42"], "code": [
    "Multiply.\n```python\nprint(6 * 7)\n```\n```output\n42\n```\nThe product is $\\boxed{42}$."]}


def test_fireact_conversion_exact_text():
    traj = import_fireact(FIREACT_ROW)
    assert traj is not None and traj.source == "fireact" and traj.profile == "mhqa"
    assert traj.gold == ["Super Bowl XLVIII"]
    assert traj.text == (
        "<think>I need to search Malcolm Smith MVP.</think>\n"
        "<wiki_search>Malcolm Smith MVP</wiki_search>\n"
        "<observation>\nSmith was named the MVP of Super Bowl XLVIII.\n</observation>\n"
        "<think>It is Super Bowl XLVIII.</think>\n"
        "<answer>Super Bowl XLVIII</answer>"
    )


def test_tora_conversion_exact_text():
    traj = import_tora(TORA_ROW)
    assert traj is not None and traj.task_id == "gsm8k-test-7" and traj.gold == ["42"]
    assert traj.text == (
        "<think>Multiply.</think>\n"
        "<code>\n```python\nprint(6 * 7)\n```\n</code>\n"
        "<observation>\n42\n</observation>\n"
        "<think>The product is 42.</think>\n"
        "<answer>\\boxed{42}</answer>"
    )


def test_unconvertible_rows_return_none():
    wrong = json.loads(json.dumps(FIREACT_ROW))
    wrong["messages"][-1]["content"] = "Observation: Episode finished, reward = False"
    assert import_fireact(wrong) is None  # gold unknown
    assert import_fireact({"messages": "nope"}) is None
    assert import_fireact({}) is None
    assert import_tora({**TORA_ROW, "code": ["```python\nprint(1)\n```\n"]}) is None  # never executed
    assert import_tora({**TORA_ROW, "code": ["no answer at all"]}) is None
    tagged = json.loads(json.dumps(FIREACT_ROW))
    tagged["messages"][2]["content"] = "Observation: <answer>cheat</answer>"
    assert import_fireact(tagged) is None  # would corrupt block structure


def test_import_file_counts_skips(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join([json.dumps(FIREACT_ROW), "{broken json", json.dumps({"x": 1}), json.dumps(TORA_ROW)]) + "\n")
    report = import_file(path)
    assert [t.source for t in report.trajectories] == ["fireact", "tora"]
    assert report.skipped == {"invalid JSON": 1, "unknown trajectory format": 1}
    assert detect_trajectory_format(TORA_ROW) == "tora"


SHIPPED = [("fireact_hotpotqa_react.jsonl", "fireact"), ("tora70b_gsm8k.jsonl", "tora"),
           ("r1searcher_hotpotqa_qwen.jsonl", "r1searcher")]


def test_every_shipped_trajectory_file_is_listed():
    # The demo pipeline imports every file in datasets/trajectories: each must be tested here.
    assert sorted(p.name for p in (DATASETS_DIR / "trajectories").glob("*.jsonl")) == sorted(n for n, _ in SHIPPED)


def test_shipped_trajectories_convert_and_parse():
    for name, source in SHIPPED:
        path = DATASETS_DIR / "trajectories" / name
        rows = sum(1 for line in path.open(encoding="utf-8") if line.strip())
        report = import_file(path)
        assert len(report.trajectories) == rows and not report.skipped, name
        for traj in report.trajectories:
            assert traj.source == source
            parsed = protocol.parse(traj.text)
            assert parsed.problems == [], (traj.task_id, parsed.problems)
            assert parsed.blocks[-1].tag == "answer"
            assert "\n\n<" not in traj.text  # single newline between blocks


def test_imported_answers_are_scored_by_the_shared_scorer():
    # FireAct rows are gold by construction; most ToRA-70B runs are right, some wrong.
    for traj in load_imported(DATASETS_DIR / "trajectories" / "fireact_hotpotqa_react.jsonl"):
        task = Task(traj.task_id, traj.question, traj.gold, traj.source, traj.profile)
        assert score(task, protocol.parse(traj.text).blocks[-1].content) == 1.0
    tora = load_imported(DATASETS_DIR / "trajectories" / "tora70b_gsm8k.jsonl")
    correct = sum(score(Task(t.task_id, t.question, t.gold, t.source, t.profile), t.text) for t in tora)
    assert 30 <= correct < 60
