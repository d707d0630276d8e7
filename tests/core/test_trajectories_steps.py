"""TrajectoryRecord.steps: computed on save, read back by load_records and HF `datasets`,
and absent from older files without breaking them."""

from __future__ import annotations

import json
from dataclasses import asdict

from coa_lab.distill.importers import load_imported
from coa_lab.paths import DATASETS_DIR
from coa_lab.trajectories import TrajectoryRecord, compute_steps, load_records, save_records

TEXT = ("<think>find it</think>\n<wiki_search>q</wiki_search>\n<observation>\nres\n</observation>\n"
        "<answer>A</answer>")


def _record(**kw) -> TrajectoryRecord:
    base = {"id": "r-1", "task_id": "t-1", "source": "teacher", "profile": "mhqa", "question": "Q?",
            "answers": ["A"], "text": TEXT}
    return TrajectoryRecord(**{**base, **kw})


def test_compute_steps_spans_slice_the_blocks():
    steps = compute_steps(TEXT, "mhqa")
    assert [(s["kind"], s["tag"]) for s in steps] == [
        ("role", "think"), ("tool", "wiki_search"), ("observation", "observation"), ("role", "answer")]
    assert [TEXT[s["start"]:s["end"]] for s in steps] == [
        "<think>find it</think>", "<wiki_search>q</wiki_search>", "<observation>\nres\n</observation>",
        "<answer>A</answer>"]


def test_stray_text_is_kept_as_a_step():
    steps = compute_steps("oops <answer>A</answer>", "mhqa")
    assert [(s["kind"], s["start"], s["end"]) for s in steps] == [("text", 0, 5), ("role", 5, 23)]


def test_save_fills_steps_without_mutating_and_load_reads_them(tmp_path):
    record = _record()
    path = save_records([record], tmp_path / "r.jsonl")
    assert record.steps == []  # the caller's object is untouched
    row = json.loads(path.read_text(encoding="utf-8"))
    assert row["steps"] == compute_steps(TEXT, "mhqa")
    (loaded,) = load_records(path)
    assert loaded.steps == row["steps"]
    assert loaded == record  # steps are derived data, left out of equality


def test_given_steps_are_saved_as_they_are(tmp_path):
    mine = [{"kind": "role", "tag": "answer", "start": 0, "end": 1}]
    path = save_records([_record(steps=mine)], tmp_path / "r.jsonl")
    assert json.loads(path.read_text(encoding="utf-8"))["steps"] == mine


def test_files_without_steps_still_load(tmp_path):
    row = asdict(_record())
    del row["steps"]
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    (loaded,) = load_records(path)
    assert loaded.steps == [] and loaded.text == TEXT


def test_steps_of_the_wrong_type_name_the_line(tmp_path):
    row = {**asdict(_record()), "steps": "nope"}
    path = tmp_path / "bad.jsonl"
    path.write_text("\n" + json.dumps(row) + "\n", encoding="utf-8")
    try:
        load_records(path)
    except ValueError as exc:
        assert f"{path}:2:" in str(exc) and "steps" in str(exc)
    else:
        raise AssertionError("expected a ValueError")


def test_hf_datasets_loads_steps(tmp_path):
    import datasets

    imported = load_imported(DATASETS_DIR / "trajectories" / "r1searcher_hotpotqa_qwen.jsonl")[:5]
    records = [t.to_record() for t in imported] + [_record(text="")]  # one with no steps at all
    path = save_records(records, tmp_path / "kept.jsonl")
    ds = datasets.load_dataset("json", data_files=str(path), split="train",
                               cache_dir=str(tmp_path / "hf_cache"))
    assert len(ds) == 6 and "steps" in ds.column_names
    first = ds[0]
    assert first["steps"] == compute_steps(first["text"], "mhqa")
    assert ds[5]["steps"] == []
    obs = [first["text"][s["start"]:s["end"]] for s in first["steps"] if s["kind"] == "observation"]
    assert obs and all(o.startswith("<observation>") and o.endswith("</observation>") for o in obs)
