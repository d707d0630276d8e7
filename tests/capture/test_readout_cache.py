"""The teacher's test readout kept by its inputs (coa_lab/capture/readout_cache.py): read back for
the same teacher, tasks, tools and code; missed when any of them changes; a torn entry is read
again, never half-used."""

from __future__ import annotations

import json

import pytest

from coa_lab.capture import readout_cache
from coa_lab.config import get_preset
from coa_lab.tasks.records import Task

TASKS = [Task("t1", "What is 6 times 7?", ["42"], "test", "math", {}),
         Task("t2", "What is 5 plus 1?", ["6"], "test", "math", {})]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COA_LAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COA_LAB_TEACHER_CACHE", "1")  # off elsewhere in the suite (tests/conftest.py)


def test_the_key_follows_every_input():
    preset = get_preset("cpu-smoke")
    key = readout_cache.readout_key(preset, TASKS, ["code"])
    assert key == readout_cache.readout_key(preset, TASKS, ["code"])
    assert key != readout_cache.readout_key(preset, TASKS[:1], ["code"])  # other tasks
    assert key != readout_cache.readout_key(preset, TASKS, ["code", "search"])  # other tools
    assert key != readout_cache.readout_key(get_preset("cpu-smoke", seed=7), TASKS, ["code"])  # another seed
    other_teacher = get_preset("cpu-smoke", capture={"teacher_model": "HuggingFaceTB/SmolLM2-360M-Instruct"})
    assert key != readout_cache.readout_key(other_teacher, TASKS, ["code"])


def test_a_kept_readout_comes_back_with_its_runs_and_zero_seconds(tmp_path):
    runs = tmp_path / "run" / "eval" / "teacher_runs.jsonl"
    runs.parent.mkdir(parents=True)
    runs.write_text('{"task_id": "t1"}\n')
    key = readout_cache.readout_key(get_preset("cpu-smoke"), TASKS, ["code"])
    assert readout_cache.load(key, tmp_path / "again.jsonl") is None
    readout_cache.store(key, {"teacher": {"all": {"accuracy": 0.5}}, "seconds": 12.5}, runs)
    back = readout_cache.load(key, tmp_path / "again" / "teacher_runs.jsonl")
    assert back["teacher"] == {"all": {"accuracy": 0.5}} and back["seconds"] == 0.0 and back["first_seconds"] == 12.5
    assert back["cached"] == key[:12]
    assert (tmp_path / "again" / "teacher_runs.jsonl").read_text() == runs.read_text()


def test_a_torn_entry_is_a_miss(tmp_path):
    runs = tmp_path / "teacher_runs.jsonl"
    runs.write_text("{}\n")
    key = readout_cache.readout_key(get_preset("cpu-smoke"), TASKS, ["code"])
    readout_cache.store(key, {"teacher": {}, "seconds": 1.0}, runs)
    folder = next((tmp_path / "cache" / "teacher_readouts").iterdir())
    (folder / "readout.json").write_text('{"teacher": ')  # a kill mid-write
    assert readout_cache.load(key, tmp_path / "out.jsonl") is None
    json.loads((folder / "teacher_runs.jsonl").read_text())  # the runs file itself is intact


def test_turned_off_it_neither_keeps_nor_reads(tmp_path, monkeypatch):
    runs = tmp_path / "teacher_runs.jsonl"
    runs.write_text("{}\n")
    key = readout_cache.readout_key(get_preset("cpu-smoke"), TASKS, ["code"])
    monkeypatch.setenv("COA_LAB_TEACHER_CACHE", "0")
    readout_cache.store(key, {"teacher": {}, "seconds": 1.0}, runs)
    assert not (tmp_path / "cache" / "teacher_readouts").exists()
    monkeypatch.setenv("COA_LAB_TEACHER_CACHE", "1")
    readout_cache.store(key, {"teacher": {}, "seconds": 1.0}, runs)
    monkeypatch.setenv("COA_LAB_TEACHER_CACHE", "0")
    assert readout_cache.load(key, tmp_path / "out.jsonl") is None


def test_evaluation_runs_the_teacher_once_for_the_same_inputs(tmp_path, monkeypatch):
    import types

    from coa_lab import pipeline
    from coa_lab.tools.registry import build_tools

    ran = []

    def capture_runs(teacher, tasks, tools, preset, traces, resume=True):
        ran.append(len(tasks))
        traces.parent.mkdir(parents=True, exist_ok=True)
        traces.write_text("".join(f'{{"task_id": "{t.id}"}}\n' for t in tasks))
        return types.SimpleNamespace(runs=[])

    monkeypatch.setattr(pipeline, "make_teacher", lambda preset: types.SimpleNamespace())
    monkeypatch.setattr(pipeline, "capture_runs", capture_runs)
    monkeypatch.setattr(pipeline, "teacher_eval", lambda runs, key_of=None: {"all": {"accuracy": 0.5}})
    preset = get_preset("cpu-smoke", eval={"headline": ("math/arith",)})
    groups, tools = {"math/arith": TASKS}, build_tools(["code"])
    first = pipeline._evaluate_teacher(preset, preset, tmp_path / "a", groups, tools)
    again = pipeline._evaluate_teacher(preset, preset, tmp_path / "b", groups, tools)
    assert ran == [2] and "cached" not in first and again["cached"] and again["seconds"] == 0.0
    assert again["teacher"] == first["teacher"]
    assert (tmp_path / "b" / "eval" / "teacher_runs.jsonl").read_text() == (tmp_path / "a" / "eval" / "teacher_runs.jsonl").read_text()
    pipeline._evaluate_teacher(preset, preset, tmp_path / "c", {"math/arith": TASKS[:1]}, tools)
    assert ran == [2, 1]  # other tasks: run again
