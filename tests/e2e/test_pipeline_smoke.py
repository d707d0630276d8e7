"""The whole recipe end to end on the embedded model, as small as it goes (cpu-smoke).

Every stage does real work: the teacher model runs tools, distillation filters, SFT trains a
LoRA, DAPO rolls out and updates, evaluation scores three models. The figures are checked
for consistency with the files each stage wrote, not for quality (a 135M model in a minute
of training is not expected to get better).
"""

import json
import math
import shutil

import pytest

from coa_lab.config import get_preset
from coa_lab.demo import run_all
from coa_lab.tasks.records import Task
from coa_lab.tasks.scorers import score
from coa_lab.trajectories import load_records

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("smoke")
    run_all(get_preset("cpu-smoke"), run, log=lambda *_: None)
    return run


def test_capture_recorded_teacher_runs(run_dir):
    summary = json.loads((run_dir / "capture" / "summary.json").read_text())
    lines = (run_dir / "capture" / "traces.jsonl").read_text().splitlines()
    # 2 arithmetic + 2 look-up tasks at one hop, 1 arithmetic task of the multi-hop share at two
    assert summary["runs"] == len(lines) == 5
    assert summary["activations"] == sum(len(json.loads(l)["activations"]) for l in lines)
    hops = sorted((json.loads(l)["hops"], sum(1 for a in json.loads(l)["activations"] if a["tool"])) for l in lines)
    assert hops == [(1, 1)] * 4 + [(2, 2)]  # every hop ran its tool
    assert summary["tool_calls"] == 6
    assert set(summary["success"]) == {"all", "math/arith", "mhqa/lookup"}
    assert summary["success"]["all"]["runs"] == 4  # the headline: the one-hop capture tasks only
    assert summary["multi_hop"]["hops"] == 2 and summary["multi_hop"]["success"]["all"]["runs"] == 1
    # the reported success is each run's final answer scored by the task's scorer, nothing else
    runs = [json.loads(l) for l in lines]
    solved = {r["task_id"]: score(Task(r["task_id"], r["question"], r["answers"], "t", r["profile"], {}), r["final_answer"])
              for r in runs}
    one_hop = [solved[r["task_id"]] for r in runs if r["hops"] == 1]
    assert summary["success"]["all"]["accuracy"] == pytest.approx(sum(one_hop) / len(one_hop))
    assert summary["multi_hop"]["success"]["all"]["accuracy"] == sum(solved[r["task_id"]] for r in runs if r["hops"] == 2)
    # the local teacher's agent prompts share their instruction and examples: prefilled once
    assert 0 < summary["prompt_tokens_prefilled"] < summary["prompt_tokens_sent"]


def test_distill_kept_a_filtered_subset(run_dir):
    summary = json.loads((run_dir / "distill" / "summary.json").read_text())
    kept = load_records(run_dir / "distill" / "kept.jsonl")
    everything = load_records(run_dir / "distill" / "all.jsonl")
    assert len(kept) == summary["kept"] and len(everything) == summary["input"]
    assert 0 < len(kept) < len(everything)
    for source, counts in summary["by_source"].items():
        stages = [counts["input"], counts["correctness"], counts["complexity"], counts["quality"], counts["reflection"]]
        assert stages == sorted(stages, reverse=True), source  # progressive: never grows
    assert all(r.reward == 1.0 for r in kept)
    # the multi-hop run is its own row, and every drop is counted under its stage's reason
    assert summary["by_source"]["teacher-2hop"]["input"] == 1 and summary["by_source"]["teacher"]["input"] == 4
    dropped = json.loads((run_dir / "distill" / "dropped.json").read_text())
    for stage, kinds in summary["dropped_by_reason"].items():
        assert sum(kinds.values()) == sum(1 for d in dropped if d["stage"] == stage), stage
    assert sum(sum(k.values()) for k in summary["dropped_by_reason"].values()) == len(everything) - len(kept)
    assert "Removed at each filter, by reason" in (run_dir / "report.md").read_text()


def test_sft_trained_with_masked_observations(run_dir):
    summary = json.loads((run_dir / "sft" / "summary.json").read_text())
    assert (run_dir / "sft" / "adapter" / "adapter_config.json").exists()
    assert summary["masked_observation_tokens"] > 0 and summary["trained_tokens"] > 0
    assert all(math.isfinite(x) for x in summary["losses"])


def test_rl_logged_every_step(run_dir):
    rl = get_preset("cpu-smoke").rl
    rows = [json.loads(l) for l in (run_dir / "rl" / "metrics.jsonl").read_text().splitlines()]
    rollouts = load_records(run_dir / "rl" / "rollouts.jsonl")
    assert len(rows) == rl.steps
    for row in rows:
        mine = [r for r in rollouts if r.metadata["step"] == row["step"]]
        # the row describes the rollouts that step really sampled ...
        assert len(mine) == row["sampled_groups"] * rl.group_size >= row["kept_groups"] * rl.group_size
        assert row["reward_task_mean"] == pytest.approx(sum(r.reward for r in mine) / len(mine))
        assert row["reward_shaped_mean"] == pytest.approx(sum(r.metadata["shaped_reward"] for r in mine) / len(mine))
        assert row["response_len_sampled"] == pytest.approx(sum(r.n_tokens for r in mine) / len(mine))
        # ... and says whether it updated: a loss when a group had a reward spread, a reason when none did
        if row["kept_groups"]:
            assert math.isfinite(row["loss"]) and row["train_tokens"] > 0 and "skipped" not in row
        else:
            assert "loss" not in row and row["skipped"]
    assert (run_dir / "rl" / "adapter" / "adapter_config.json").exists()
    pool = json.loads((run_dir / "rl" / "pool.json").read_text())
    assert pool["candidates"] == 4 and sum(pool["histogram"].values()) == 4  # every candidate was screened


def test_eval_compares_three_models_and_the_teacher(run_dir):
    summary = json.loads((run_dir / "eval" / "summary.json").read_text())
    assert {"base", "sft", "rl", "teacher"} <= summary.keys()
    mix = get_preset("cpu-smoke").eval.tasks
    for label in ("base", "sft", "rl"):
        assert set(summary[label]) == set(mix)
        for key, n in mix.items():
            assert summary[label][key]["tasks"] == n
        # the accuracies are the scored trajectories the stage wrote, weighted by their tasks
        records = load_records(run_dir / "eval" / f"{label}_trajectories.jsonl")
        assert len(records) == sum(mix.values()) * get_preset("cpu-smoke").eval.samples
        reported = sum(s["accuracy"] * s["tasks"] * s["samples"] for s in summary[label].values())
        assert reported == pytest.approx(sum(r.reward for r in records))
        valid = sum(s["format_valid"] * s["tasks"] * s["samples"] for s in summary[label].values())
        assert valid == pytest.approx(sum(r.metadata["valid"] for r in records))
    teacher = summary["teacher"]
    assert teacher["all"]["runs"] == 4 and teacher["all"]["tokens_per_task"] > 0  # the headline tasks only
    # where the stage's time went, one figure per evaluated system, shown in the report
    assert set(summary["seconds_by_system"]) == {"base", "sft", "rl", "control", "teacher"}
    assert sum(summary["seconds_by_system"].values()) <= summary["seconds"] + 1
    assert "(seconds: base " in (run_dir / "report.md").read_text()


def test_rl_is_read_against_its_control_greedy_and_sampled(run_dir):
    """The control is the RL stage with its policy gradient off (the same steps and SFT rows, nothing
    sampled), from the same SFT adapter; SFT, control and RL are read greedy and at rl.temperature."""
    preset = get_preset("cpu-smoke")
    ctl = json.loads((run_dir / "control" / "rl" / "summary.json").read_text())
    assert len(ctl["metrics"]) == preset.rl.steps and all(m["arm"] == "control" for m in ctl["metrics"])
    weights = [(run_dir / d / "adapter_model.safetensors").read_bytes() for d in ("sft/adapter", "control/rl/adapter")]
    assert weights[0] != weights[1]  # the SFT mix moved it
    ev = json.loads((run_dir / "eval" / "summary.json").read_text())
    k = preset.eval.control_samples
    assert ev["sampled"]["samples"] == k and ev["sampled"]["temperature"] == preset.rl.temperature
    for label in ("sft", "control", "rl"):
        records = load_records(run_dir / "eval" / f"sampled_{label}_trajectories.jsonl")
        assert len(records) == k * sum(n for key, n in preset.eval.tasks.items() if key in preset.eval.headline)
    versus = json.loads((run_dir / "summary.json").read_text())["rl_against_control"]
    block = versus["rl_minus_control"]
    assert set(block) == {"greedy", f"avg_at_{k}"} and block["greedy"]["tasks"] == 4
    assert block["greedy"]["gain"] == pytest.approx(block["greedy"]["after"] - block["greedy"]["before"])
    assert "## RL against its control" in (run_dir / "report.md").read_text()


def test_summary_json_has_the_headline_figures(run_dir):
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("teacher_success", "kept_from_teacher_fraction", "base_accuracy", "sft_accuracy", "sft_format_valid",
                "rl_accuracy", "rl_steps", "rl_updates", "rl_train_accuracy_by_step", "teacher_accuracy",
                "tokens_per_success_ratio", "eval_tasks", "seconds", "rl_revisited_questions"):
        assert key in summary, key
    assert summary["eval_tasks"] == 4 and summary["rl_steps"] == len(summary["rl_train_accuracy_by_step"]) == 1
    assert summary["seconds"] > 0
    distilled = json.loads((run_dir / "distill" / "summary.json").read_text())
    assert summary["kept_from_teacher_fraction"] == pytest.approx(
        (distilled["kept_by_source"].get("teacher", 0) + distilled["kept_by_source"].get("teacher-2hop", 0))
        / distilled["kept"])


def test_report_and_plots_written(run_dir):
    report = (run_dir / "report.md").read_text()
    for stage in ("capture", "distill", "sft", "rl", "control", "eval"):
        assert f"| {stage} |" in report
    assert (run_dir / "sft_loss.png").stat().st_size > 1000
    assert (run_dir / "eval.png").stat().st_size > 1000


def test_a_demo_cut_in_its_evaluation_resumes_there(run_dir, tmp_path):
    """`coa-lab demo --resume` on a copy of the smoke run killed while evaluating RL: the five finished stages
    are kept, evaluation reads only RL again (the other systems' readouts are in eval/done), the same figures."""
    run = tmp_path / "resumed"
    shutil.copytree(run_dir, run, symlinks=True)  # copy2 keeps the mtimes finished_stages reads
    before = json.loads((run / "eval" / "summary.json").read_text())
    (run / "eval" / "summary.json").unlink()
    (run / "eval" / "done" / "rl.json").unlink()
    logged = []
    run_all(get_preset("cpu-smoke"), run, log=logged.append, resume=True)
    assert [line for line in logged if line.startswith("== ")][-1].startswith("== eval (")
    after = json.loads((run / "eval" / "summary.json").read_text())
    assert after["rl"] == before["rl"] and after["seconds_by_system"] == before["seconds_by_system"] | {
        "rl": after["seconds_by_system"]["rl"]}
    timing = json.loads((run / "timing.json").read_text())
    assert timing["resumed"] == {"kept": ["capture", "distill", "sft", "rl", "control"], "continued": "eval"}
    assert "Resumed (`coa-lab demo --resume`)" in (run / "report.md").read_text()
