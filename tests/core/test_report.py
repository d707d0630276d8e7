"""coa_lab/report.py: the paired RL figure (same questions, first step vs last step)."""

from __future__ import annotations

import json

from coa_lab.report import revisited_questions


def _rollout(task: str, step: int, reward: float) -> dict:
    return {"task_id": task, "reward": reward, "metadata": {"step": step}}


def test_revisited_questions_pairs_first_and_last_step_of_each_question(tmp_path):
    rows = [_rollout("a", 0, 0.0), _rollout("a", 0, 1.0), _rollout("a", 3, 1.0), _rollout("a", 5, 1.0),
            _rollout("b", 1, 0.0), _rollout("b", 4, 0.0), _rollout("b", 4, 1.0),
            _rollout("c", 2, 1.0)]  # c was sampled at one step only: no pair
    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    got = revisited_questions(path)
    assert got == {"questions": 2, "first": (0.5 + 0.0) / 2, "last": (1.0 + 0.5) / 2}
    # anchors (questions sampled beside the pool) are left out of the pool's figure
    assert revisited_questions(path, exclude={"b"}) == {"questions": 1, "first": 0.5, "last": 1.0}


def test_revisited_questions_without_pairs_or_file(tmp_path):
    assert revisited_questions(tmp_path / "missing.jsonl") is None
    path = tmp_path / "rollouts.jsonl"
    path.write_text(json.dumps(_rollout("a", 0, 1.0)) + "\n")
    assert revisited_questions(path) is None


def test_report_shows_how_the_machine_drifted_during_the_run(tmp_path):
    """Stage seconds mean little without the machine's speed; on a shared machine it moves."""
    from coa_lab.report import write_report

    machine = {"cores": 2, "fp32_gflops": 84.5, "bf16_gflops": 1.2, "bf16_autocast": False}
    (tmp_path / "timing.json").write_text(json.dumps(
        {"sft": 446.2, "total_seconds": 2336.9, "machine": machine, "machine_start": {**machine, "fp32_gflops": 179.2}}))
    text = write_report(tmp_path).read_text()
    assert "fp32 179 (start) → 84 (end) GFLOP/s" in text


def test_publish_run_writes_the_run_files_figures_with_provenance(tmp_path):
    """`COA_LAB_PUBLISH=1 coa-lab demo`: the README's demo table reads docs/results/demo.json,
    which must hold what the run's own files say (and refuse a run that has not finished)."""
    import pytest

    from coa_lab.published import check_figures
    from coa_lab.report import publish_run, write_summary

    run = tmp_path / "run"
    (run / "distill").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="coa-lab demo"):
        publish_run(run, "demo", "test", directory=tmp_path / "docs" / "results")
    machine = {"cores": 2, "fp32_gflops": 150.0, "bf16_gflops": 1.2, "bf16_autocast": False}
    (run / "timing.json").write_text(json.dumps({"rl": 600.0, "total_seconds": 1500.0, "machine": machine,
                                                 "machine_start": machine}))
    funnel = {"input": 72, "kept": 51, "by_source": {"teacher": {"input": 72, "correctness": 51}},
              "kept_by_source": {"teacher": 51}}
    (run / "distill" / "summary.json").write_text(json.dumps(funnel))
    write_summary(run)
    path = publish_run(run, "demo", "COA_LAB_PUBLISH=1 coa-lab demo", directory=tmp_path / "docs" / "results")
    doc = json.loads(path.read_text())
    assert doc["source"] == "COA_LAB_PUBLISH=1 coa-lab demo" and doc["provenance"]["machine"] == machine
    assert doc["funnel"] == funnel and doc["summary"]["stage_seconds"] == {"rl": 600.0}
    assert doc["summary"]["rl_time_share"] == 0.4  # issue 26's bound: RL within 40% of the demo
    link = '[600](docs/results/demo.json "summary.stage_seconds.rl")'
    assert check_figures(f"RL took {link} s", tmp_path) == (1, [])  # a link into it checks out...
    n, problems = check_figures(f"RL took {link.replace('[600]', '[500]')} s", tmp_path)
    assert n == 1 and problems  # ...and a wrong figure does not


def _eval_rows(label: str, rewards: dict[str, list[float]], suite: str = "math/arith") -> str:
    return "".join(json.dumps({"task_id": t, "reward": r, "metadata": {"suite": suite}}) + "\n"
                   for t, rs in rewards.items() for r in rs)


def test_paired_gain_is_the_mean_task_difference_with_its_standard_error(tmp_path):
    """RL − SFT task by task: 4 tasks, differences +1, 0, 0, -0.5 (two samples of d average to
    0.5): mean 0.125; sample variance of the differences / n under the square root."""
    from coa_lab.report import paired_gain

    (tmp_path / "sft_trajectories.jsonl").write_text(
        _eval_rows("sft", {"a": [0.0], "b": [1.0], "c": [0.0], "d": [1.0, 1.0]})
        + _eval_rows("sft", {"hard": [0.0]}, suite="math/gsm8k"))  # not a headline benchmark: left out
    (tmp_path / "rl_trajectories.jsonl").write_text(
        _eval_rows("rl", {"a": [1.0], "b": [1.0], "c": [0.0], "d": [1.0, 0.0]})
        + _eval_rows("rl", {"hard": [1.0]}, suite="math/gsm8k"))
    got = paired_gain(tmp_path, ("math/arith",))
    diffs = [1.0, 0.0, 0.0, -0.5]
    mean = sum(diffs) / 4
    se = (sum((d - mean) ** 2 for d in diffs) / 3 / 4) ** 0.5
    assert got["tasks"] == 4 and got["rl_only"] == 1 and got["sft_only"] == 1
    assert abs(got["gain"] - mean) < 1e-12 and abs(got["se"] - se) < 1e-12
    assert paired_gain(tmp_path, ("mhqa/lookup",)) is None  # no task of that benchmark
    assert paired_gain(tmp_path / "missing", ("math/arith",)) is None


def test_report_says_when_rl_minus_sft_is_within_noise(tmp_path):
    """The report's RL − SFT row carries the paired SE, and says so when the gain is within 2 SE."""
    from coa_lab.report import write_report

    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "preset.json").write_text(json.dumps({"name": "cpu-quick", "eval": {"headline": ["math/arith"]}}))
    tasks = [f"t{i}" for i in range(20)]
    sft = {t: [1.0 if i % 2 else 0.0] for i, t in enumerate(tasks)}
    rl_noise = {t: [1.0 if (i % 2 or i == 0) else 0.0] for i, t in enumerate(tasks)}  # +1 task of 20
    for label, rows in (("sft", sft), ("rl", rl_noise)):
        (run / "eval" / f"{label}_trajectories.jsonl").write_text(_eval_rows(label, rows))
    summary = {"tasks": 20, "samples": 1, "accuracy": 0.5, "format_valid": 1.0, "tokens_per_success": 10.0,
               "answered": 1.0, "tokens_per_sample": 10.0, "tool_calls_per_success": 1.0}
    (run / "eval" / "summary.json").write_text(json.dumps(
        {"sft": {"math/arith": summary}, "rl": {"math/arith": {**summary, "accuracy": 0.55}}, "seconds": 1.0}))
    text = write_report(run).read_text()
    assert "+5.0 points (paired standard error ±5.0 over 20 tasks; right only after RL: 1, only before: 0" in text
    assert "a re-run could reverse it" in text
    rl_clear = {t: [1.0] for t in tasks}  # +10 tasks of 20: well beyond 2 SE
    (run / "eval" / "rl_trajectories.jsonl").write_text(_eval_rows("rl", rl_clear))
    (run / "eval" / "summary.json").write_text(json.dumps(
        {"sft": {"math/arith": summary}, "rl": {"math/arith": {**summary, "accuracy": 1.0}}, "seconds": 1.0}))
    text = write_report(run).read_text()
    assert "+50.0 points (paired standard error" in text and "a re-run could reverse it" not in text


def test_report_plots_the_shaped_reward_of_new_and_old_rl_metrics(tmp_path, monkeypatch):
    """RL rows name the task and the shaped reward apart; a run folder written before that has
    only "reward_mean" (which was the shaped one) and must still plot."""
    import matplotlib.axes

    from coa_lab.report import write_report

    row = {"accuracy": 0.5, "kept_groups": 1, "sampled_groups": 2, "tool_calls_per_rollout": 1.0, "seconds": 3.0}
    plotted = []
    real = matplotlib.axes.Axes.plot

    def spy(self, *args, **kwargs):
        plotted.append((kwargs.get("label"), list(args[1])))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    for name, rewards in (("new", {"reward_task_mean": 0.5, "reward_shaped_mean": 0.25}), ("old", {"reward_mean": 0.25})):
        run = tmp_path / name
        (run / "rl").mkdir(parents=True)
        (run / "rl" / "summary.json").write_text(json.dumps(
            {"pool": 4, "seconds": 9.0, "metrics": [{"step": 0, **row, **rewards}]}))
        write_report(run)
        assert (run / "rl_reward.png").exists()
        assert ("reward (shaped)", [0.25]) in plotted, name
        plotted.clear()


def test_the_evaluation_table_states_the_base_models_cut_and_a_teacher_read_back_from_the_cache():
    from coa_lab.report import _eval_lines

    suite = {"tasks": 2, "accuracy": 0.5, "answered": 1.0, "format_valid": 1.0, "tokens_per_sample": 90.0,
             "tokens_per_success": 80.0, "tool_calls_per_success": 1.0}
    ev = {"base": {"math/arith": dict(suite, accuracy=0.0)}, "sft": {"math/arith": suite},
          "val": {"sft": {"math/arith": suite}}, "cached": "0123456789ab", "first_seconds": 212.0}
    text = "\n".join(_eval_lines(ev))
    assert "| val_sft | math/arith |" in text and "| val_base" not in text
    assert "base model is read on the test split only" in text
    assert "read back from the cache (key 0123456789ab; computed in 212.0 s" in text
    plain = "\n".join(_eval_lines({"sft": {"math/arith": suite}}))
    assert "test split only" not in plain and "cache" not in plain
