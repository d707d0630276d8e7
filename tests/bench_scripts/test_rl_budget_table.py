"""benchmarks/rl_budget_table.py: the policy gradient's effect over its control, budget by budget."""

from __future__ import annotations

import json

import pytest
from conftest import import_benchmark


def _arms(tmp_path, name, rl_outcomes, control_outcomes, rollouts):
    tasks = [f"t{i}" for i in range(len(rl_outcomes[0]))]
    seeds = list(range(len(rl_outcomes)))
    doc = {"task_ids": tasks, "split": "val", "tasks": len(tasks), "overrides": ["rl.group_size=8"],
           "arms": {"rl+ptx": {"seeds": seeds, "outcomes": {str(s): o for s, o in zip(seeds, rl_outcomes)},
                               "rollouts": rollouts, "sample_seconds": [10.0] * len(seeds),
                               "update_seconds": [5.0] * len(seeds), "accuracy": [sum(o) / len(o) for o in rl_outcomes]},
                    "control": {"seeds": seeds, "outcomes": {str(s): o for s, o in zip(seeds, control_outcomes)}}}}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


def test_each_budget_gets_the_paired_difference_and_its_time(tmp_path, capsys):
    table = import_benchmark("rl_budget_table")
    one = _arms(tmp_path, "one", [[1, 1, 0, 0], [1, 0, 0, 0]], [[1, 0, 0, 0], [1, 0, 0, 0]], [300, 310])
    row = table.budget_row("2x", json.loads(one.read_text()))
    assert row["rl_ptx_minus_control"] == [0.25, 0.0] and row["won"] == [1, 0] and row["lost"] == [0, 0]
    assert row["mean"] == pytest.approx(0.125) and row["ci95"][0] <= 0.125 <= row["ci95"][1]
    assert row["rollouts"] == [300, 310] and row["group_size_override"] == ["rl.group_size=8"]
    assert table.main([f"1x={one}", f"2x={one}"]) == 0
    assert "2x: rl+ptx - control per seed +25.0" in capsys.readouterr().out


def test_budgets_on_different_tasks_are_refused(tmp_path):
    table = import_benchmark("rl_budget_table")
    a = _arms(tmp_path, "a", [[1, 0, 0, 0]], [[0, 0, 0, 0]], [1])
    b = _arms(tmp_path, "b", [[1, 0, 0]], [[0, 0, 0]], [1])
    with pytest.raises(SystemExit, match="same split and tasks"):
        table.main([f"1x={a}", f"2x={b}"])
