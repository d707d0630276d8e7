"""benchmarks/probe_rl_drift.py's per-template bookkeeping: where RL's drift shows."""

from __future__ import annotations


import pytest
from conftest import import_benchmark


@pytest.fixture(scope="module")
def probe():
    return import_benchmark("probe_rl_drift")


def test_flips_count_lost_and_gained_tasks_per_template(probe):
    template = {"f1": "farm", "f2": "farm", "s1": "stickers", "s2": "stickers", "w1": "warehouse"}
    sft = {"f1": 1.0, "f2": 1.0, "s1": 0.0, "s2": 0.0, "w1": 1.0}
    rl = {"f1": 0.0, "f2": 0.0, "s1": 1.0, "s2": 0.0, "w1": 1.0}
    assert probe.flips(sft, rl, template) == {"farm": [2, 0], "stickers": [0, 1]}  # unchanged ones count nowhere
    assert probe.by_template(rl, template) == {"farm": [0.0, 2], "stickers": [0.5, 2], "warehouse": [1.0, 1]}


def test_sft_set_counted_per_template_from_the_shipped_train_split(probe, tmp_path):
    from coa_lab.tasks.suites import load_suite
    from coa_lab.trajectories import TrajectoryRecord, save_records

    arith = load_suite("math", "train", benchmark="arith")[0]
    lookup = load_suite("mhqa", "train", benchmark="lookup")[0]
    rows = [TrajectoryRecord(f"teacher-{t.id}", t.id, "teacher", t.profile, t.question, t.answers, "x")
            for t in (arith, arith, lookup)]
    rows.append(TrajectoryRecord("fireact-q1", "fireact-q1", "fireact", "mhqa", "q", ["a"], "x"))  # not a shipped task
    save_records(rows, tmp_path / "kept.jsonl")
    counts = probe.sft_set_by_template(tmp_path / "kept.jsonl")
    assert counts == {probe.template_of(arith): 2, f"lookup:{lookup.metadata['relation']}": 1, "fireact": 1}
