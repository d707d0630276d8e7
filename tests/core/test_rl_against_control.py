"""coa_lab/rl_against_control.py: RL against its control from the eval stage's per-task files."""

from __future__ import annotations

import json

import pytest

from coa_lab.rl_against_control import against_control, control_lines

HEADLINE = ("math/arith", "mhqa/lookup")


def _write(path, rewards: dict[str, list[float]], suite: str = "math/arith") -> None:
    path.write_text("".join(json.dumps({"task_id": t, "reward": r, "metadata": {"suite": suite}}) + "\n"
                            for t, rs in rewards.items() for r in rs))


def _eval_dir(tmp_path, sampled: bool = True):
    d = tmp_path / "eval"
    d.mkdir()
    greedy = {"sft": [0, 1, 0, 1], "control": [1, 1, 0, 0], "rl": [1, 1, 1, 0]}
    for label, rs in greedy.items():
        _write(d / f"{label}_trajectories.jsonl", {f"t{i}": [r] for i, r in enumerate(rs)})
        with (d / f"{label}_trajectories.jsonl").open("a") as fh:  # a hard row outside the headline: not counted
            fh.write(json.dumps({"task_id": "gsm", "reward": 1.0, "metadata": {"suite": "math/gsm8k"}}) + "\n")
    if sampled:
        two = {"sft": [[0, 0], [1, 0], [0, 0], [1, 1]], "control": [[1, 0], [1, 0], [0, 0], [1, 0]],
               "rl": [[1, 1], [1, 1], [1, 0], [1, 0]]}
        for label, rs in two.items():
            _write(d / f"sampled_{label}_trajectories.jsonl", {f"t{i}": r for i, r in enumerate(rs)})
    (d / "summary.json").write_text(json.dumps({"sampled": {"samples": 2, "temperature": 0.8}} if sampled else {}))
    return d


def test_each_comparison_is_paired_on_the_headline_tasks_greedy_and_sampled(tmp_path):
    out = against_control(_eval_dir(tmp_path), HEADLINE)
    assert out["samples"] == 2 and out["temperature"] == 0.8
    greedy = out["rl_minus_control"]["greedy"]
    assert greedy["tasks"] == 4 and greedy["gain"] == pytest.approx(0.25)  # t2 won, nothing lost
    assert (greedy["won"], greedy["lost"]) == (1, 0) and greedy["before"] == 0.5 and greedy["after"] == 0.75
    avg = out["rl_minus_control"]["avg_at_2"]  # per task: +0.5, +0.5, +0.5, 0
    assert avg["gain"] == pytest.approx(0.375) and avg["ci95"][0] <= avg["gain"] <= avg["ci95"][1]
    assert out["control_minus_sft"]["greedy"]["gain"] == pytest.approx(0.0)
    assert (out["control_minus_sft"]["greedy"]["won"], out["control_minus_sft"]["greedy"]["lost"]) == (1, 1)
    text = "\n".join(control_lines(out))
    assert "| RL − control: what the policy gradient added | +25.0 [" in text and "avg@2 at T = 0.8" in text


def test_greedy_only_and_no_control(tmp_path):
    d = _eval_dir(tmp_path, sampled=False)
    out = against_control(d, HEADLINE)
    assert set(out["rl_minus_control"]) == {"greedy"} and out["samples"] == 0
    assert "avg@" not in "\n".join(control_lines(out))
    (d / "control_trajectories.jsonl").unlink()  # a run without its control: no section
    assert against_control(d, HEADLINE) is None and control_lines(None) == []
