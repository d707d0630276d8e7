"""benchmarks/probe_sft_epochs.py: SFT arms that differ in epochs only, scored paired."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import import_benchmark

from coa_lab.config import get_preset


@pytest.fixture(scope="module")
def probe():
    return import_benchmark("probe_sft_epochs")


def test_paired_counts_and_refuses_different_tasks(probe):
    first = {"a": 1, "b": 1, "c": 0, "d": 0}
    other = {"a": 1, "b": 0, "c": 1, "d": 0}
    assert probe.paired(first, other) == {"both": 1, "first_only": 1, "other_only": 1}
    with pytest.raises(ValueError, match="different tasks"):
        probe.paired(first, {"a": 1})


def test_an_arm_changes_only_the_epochs_and_a_given_adapter_is_not_retrained(probe, tmp_path, monkeypatch):
    run = tmp_path / "run"
    (run / "distill").mkdir(parents=True)
    (run / "distill" / "kept.jsonl").write_text('{"x": 1}\n{"x": 2}\n')
    recorded = get_preset("cpu-smoke", sft={"learning_rate": 1e-4})  # a run's own override is kept
    (run / "preset.json").write_text(json.dumps(recorded.to_dict()))
    monkeypatch.setenv("COA_LAB_RUNS", str(tmp_path / "runs"))
    trained = []

    def fake_sft(preset, out):
        trained.append(preset)
        assert (out / "distill" / "kept.jsonl").read_text() == (run / "distill" / "kept.jsonl").read_text()
        return {"losses": [1.0, 0.5, 0.2], "last_loss": 0.2}

    scores = {"five": {"t1": 1, "t2": 1, "t3": 0}, "ep3": {"t1": 1, "t2": 0, "t3": 1}}

    def fake_score(preset, adapter, groups, tools):
        per_task = scores[Path(adapter).parent.parent.name if adapter.name == "adapter" else adapter.name]
        return {"math/arith": {"accuracy": sum(per_task.values()) / 3, "format_valid": 1.0, "tasks": 3}}, per_task

    monkeypatch.setattr(probe.pipeline, "sft", fake_sft)
    monkeypatch.setattr(probe, "score", fake_score)
    monkeypatch.setattr(probe.pipeline, "make_tools", lambda preset: None)
    given = tmp_path / "five"
    assert probe.main(["--run", str(run), "--epochs", "5", "3", "--adapter", f"5={given}",
                       "--arith", "2", "--lookup", "1"]) == 0
    assert len(trained) == 1  # the 5-epoch adapter was given
    arm = trained[0]
    assert arm.sft.epochs == 3.0
    assert arm.sft.learning_rate == 1e-4
    assert {**arm.to_dict(), "sft": None} == {**recorded.to_dict(), "sft": None}
    assert {**arm.to_dict()["sft"], "epochs": None} == {**recorded.to_dict()["sft"], "epochs": None}
    out = json.loads((tmp_path / "runs" / "bench" / "sft_epochs.json").read_text())
    assert [a["epochs"] for a in out["arms"]] == [5.0, 3.0]
    assert out["arms"][0]["adapter"] == f"given: {given}" and "train_seconds" not in out["arms"][0]
    assert out["arms"][1]["optimizer_steps"] == 3
    assert out["arms"][1]["against_first"] == {"both": 1, "first_only": 1, "other_only": 1}
    assert out["kept_trajectories"] == 2 and out["split"] == "val"


def test_a_run_without_kept_trajectories_is_refused(probe, tmp_path):
    with pytest.raises(SystemExit, match="no distill/kept.jsonl"):
        probe.main(["--run", str(tmp_path)])
