"""coa_lab/trajectories.py: JSONL round trip, HF datasets compatibility, precise errors,
atomic writes."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from coa_lab import trajectories
from coa_lab.trajectories import SCHEMA_VERSION, TrajectoryRecord, load_records, save_records


def _records():
    return [
        TrajectoryRecord(
            id="t-1", task_id="math-1", source="teacher", profile="math", question="What is 6*7?",
            answers=["42"], text="<think>t</think>\n<answer>\\boxed{42}</answer>", reward=1.0, n_tokens=12,
            n_tool_calls=0, metadata={"k": [1, 2], "nested": {"a": None}},
        ),
        TrajectoryRecord(
            id="t-2", task_id="mhqa-7", source="fireact", profile="mhqa", question="Où est Zürich? 東京?",
            answers=["Switzerland", "CH"], text="<wiki_search>Zürich</wiki_search>\n<observation>\n\"quoted\" \\ "
            "</ newline\n</observation>\n<answer>Switzerland</answer>",
        ),
    ]


def test_roundtrip(tmp_path):
    recs = _records()
    path = save_records(recs, tmp_path / "sub" / "kept.jsonl")
    assert path == tmp_path / "sub" / "kept.jsonl" and path.exists()
    assert load_records(path) == recs
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2
    assert json.loads(lines[1])["question"] == "Où est Zürich? 東京?"
    assert not (tmp_path / "sub" / "kept.jsonl.tmp").exists()


def test_roundtrip_empty(tmp_path):
    path = save_records([], tmp_path / "empty.jsonl")
    assert path.read_text() == ""
    assert load_records(path) == []


def test_save_overwrites_previous(tmp_path):
    path = tmp_path / "r.jsonl"
    save_records(_records(), path)
    save_records(_records()[:1], path)
    assert [r.id for r in load_records(path)] == ["t-1"]


def test_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "r.jsonl"
    rows = [json.dumps(asdict(r)) for r in _records()]
    path.write_text("\n" + rows[0] + "\n\n   \n" + rows[1] + "\n")
    assert load_records(path) == _records()


def test_defaults_fill_optional_fields_and_unknown_keys_are_ignored(tmp_path):
    path = tmp_path / "r.jsonl"
    row = {"id": "a", "task_id": "b", "source": "s", "profile": "mhqa", "question": "q", "answers": ["x"],
           "text": "<answer>x</answer>", "future_field": 1}
    path.write_text(json.dumps(row) + "\n")
    (rec,) = load_records(path)
    assert rec.reward is None and rec.n_tool_calls == 0 and rec.metadata == {}
    assert rec.schema_version == SCHEMA_VERSION


def test_loadable_with_hf_datasets(tmp_path):
    datasets = pytest.importorskip("datasets")
    path = save_records(_records(), tmp_path / "kept.jsonl")
    ds = datasets.load_dataset("json", data_files=str(path), split="train",
                               cache_dir=str(tmp_path / "hf_cache"))
    assert ds.num_rows == 2
    assert ds["id"] == ["t-1", "t-2"]
    assert ds["text"] == [r.text for r in _records()]
    assert ds["answers"] == [["42"], ["Switzerland", "CH"]]
    assert ds["question"][1] == "Où est Zürich? 東京?"


def _write_with_bad_line(tmp_path, bad_line: str, line_no: int = 3):
    good = [json.dumps(asdict(r)) for r in _records()]
    lines = [good[0], good[1], good[0]]
    lines.insert(line_no - 1, bad_line)
    path = tmp_path / "broken_file.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _assert_error(path, line_no: int, fragment: str):
    with pytest.raises(ValueError) as exc:
        load_records(path)
    msg = str(exc.value)
    assert str(path) in msg and path.name in msg
    assert f":{line_no}:" in msg
    assert fragment in msg


def test_broken_json_line(tmp_path):
    path = _write_with_bad_line(tmp_path, '{"id": "x", "task_id": ', 3)
    _assert_error(path, 3, "invalid JSON")


def test_broken_json_line_number_counts_blank_lines(tmp_path):
    good = json.dumps(asdict(_records()[0]))
    path = tmp_path / "f.jsonl"
    path.write_text(good + "\n\n" + "not json" + "\n")
    _assert_error(path, 3, "invalid JSON")


@pytest.mark.parametrize("bad,kind", [("[1, 2]", "list"), ('"text"', "str"), ("42", "int"), ("null", "NoneType")])
def test_non_object_line(tmp_path, bad, kind):
    path = _write_with_bad_line(tmp_path, bad, 2)
    _assert_error(path, 2, f"expected a JSON object, got {kind}")


@pytest.mark.parametrize("field", ["id", "task_id", "source", "profile", "question", "answers", "text"])
def test_missing_field(tmp_path, field):
    row = asdict(_records()[0])
    del row[field]
    path = _write_with_bad_line(tmp_path, json.dumps(row), 4)
    _assert_error(path, 4, f"missing field(s) ['{field}']")


def test_newer_schema_version(tmp_path):
    row = asdict(_records()[0])
    row["schema_version"] = SCHEMA_VERSION + 1
    path = _write_with_bad_line(tmp_path, json.dumps(row), 1)
    _assert_error(path, 1, f"schema_version {SCHEMA_VERSION + 1} is newer")


def test_older_or_equal_schema_version_loads(tmp_path):
    row = asdict(_records()[0])
    row["schema_version"] = SCHEMA_VERSION
    path = tmp_path / "ok.jsonl"
    path.write_text(json.dumps(row) + "\n")
    assert load_records(path)[0].id == "t-1"


def test_non_integer_schema_version_is_a_value_error(tmp_path):
    row = asdict(_records()[0])
    row["schema_version"] = "2"
    path = _write_with_bad_line(tmp_path, json.dumps(row), 2)
    _assert_error(path, 2, "schema_version")


def test_interrupted_write_keeps_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "kept.jsonl"
    save_records(_records(), path)
    before = path.read_bytes()

    real_dumps = json.dumps
    calls = {"n": 0}

    def flaky_dumps(obj, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # the first record is already written when this fails
            raise RuntimeError("disk full / killed")
        return real_dumps(obj, *args, **kwargs)

    monkeypatch.setattr(trajectories.json, "dumps", flaky_dumps)
    new = [_records()[0], _records()[1], _records()[0]]
    new[0].id = "NEW"
    with pytest.raises(RuntimeError, match="disk full"):
        save_records(new, path)
    monkeypatch.setattr(trajectories.json, "dumps", real_dumps)
    assert calls["n"] == 2
    assert path.read_bytes() == before
    assert [r.id for r in load_records(path)] == ["t-1", "t-2"]


def test_interrupted_first_write_creates_no_file(tmp_path, monkeypatch):
    path = tmp_path / "new.jsonl"

    def boom(*a, **k):
        raise RuntimeError("killed")

    monkeypatch.setattr(trajectories.json, "dumps", boom)
    with pytest.raises(RuntimeError):
        save_records(_records(), path)
    assert not path.exists()
