"""benchmarks/bench_rl_seeds.py's bookkeeping: the issue's targets computed from the seeds, and
which interrupted seed --append may score without training it again."""

from __future__ import annotations

import json

import pytest
from conftest import import_benchmark

from coa_lab.config import get_preset


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_rl_seeds")


def _out(gains, formats, curves, sft_format=0.97):
    return {"gains": gains, "rl_format_valid": formats, "sft_format_valid": sft_format,
            "train_accuracy_by_step": curves}


def test_targets_met_only_when_every_condition_holds(bench):
    up = [0.5, 0.5, 0.6, 0.6, 0.7, 0.7]
    good = _out([0.06, 0.05, 0.07, 0.05, 0.06], [0.97] * 5, [up] * 5)
    t = bench.targets(good)
    assert t == {"seeds_done": 5, "rl_above_sft": 5, "rl_ties_sft": 0, "mean_gain_points": 5.8,
                 "worst_format_drop_points": 0.0, "last_third_ge_first_third": 5, "met": True}
    tie = bench.targets({**good, "gains": [0.06, 0.05, 0.07, 0.05, 0.0]})
    assert (tie["rl_above_sft"], tie["rl_ties_sft"]) == (4, 1)  # a tie is not a gain
    assert not bench.targets({**good, "gains": [0.10, 0.10, 0.10, 0.10, -0.01]})["met"]  # one seed below SFT
    assert not bench.targets({**good, "gains": [0.04] * 5})["met"]  # mean under +5 points
    assert not bench.targets({**good, "rl_format_valid": [0.97, 0.97, 0.94, 0.97, 0.97]})["met"]  # format -3
    down = list(reversed(up))
    assert not bench.targets({**good, "train_accuracy_by_step": [up, up, up, down, down]})["met"]  # 3 of 5 climb
    assert not bench.targets({**good, "gains": good["gains"][:4], "rl_format_valid": [0.97] * 4,
                              "train_accuracy_by_step": [up] * 4})["met"]  # four seeds are not five
    assert bench.thirds([1.0, 0.0]) is None and bench.thirds([0.0, 1.0, 1.0]) == (0.0, 1.0)


def test_append_scores_only_a_seed_whose_rl_stage_finished(bench, tmp_path):
    preset = get_preset("cpu-tiny")
    run = tmp_path / "seed3"
    assert bench._finished_rl(run, preset) is None  # nothing there
    (run / "rl" / "adapter").mkdir(parents=True)
    summary = {"metrics": [{"step": i} for i in range(preset.rl.steps)], "seconds": 700.0}
    (run / "rl" / "summary.json").write_text(json.dumps(summary))
    assert bench._finished_rl(run, preset) is None  # no saved adapter
    (run / "rl" / "adapter" / "adapter_config.json").write_text("{}")
    assert bench._finished_rl(run, preset) == summary
    short = {**summary, "metrics": summary["metrics"][:-1]}  # stopped one step early
    (run / "rl" / "summary.json").write_text(json.dumps(short))
    assert bench._finished_rl(run, preset) is None


def test_an_adapter_without_its_sft_set_is_refused_before_any_work(bench, tmp_path, monkeypatch):
    """A preset that mixes the SFT trajectories into every update (rl.sft_coef > 0): an adapter copied out of
    its run folder has none beside it, which must stop the benchmark at once, not after the pool
    screening (a 20-minute loss, 2026-11-27)."""
    monkeypatch.setenv("COA_LAB_RUNS", str(tmp_path / "runs"))
    monkeypatch.setattr(bench.pipeline, "draw_tasks", lambda *a, **k: pytest.fail("work began"))
    lone = tmp_path / "copied" / "adapter"
    lone.mkdir(parents=True)
    with pytest.raises(SystemExit, match="kept.jsonl is missing"):
        bench.main(["--sft-adapter", str(lone), "--seeds", "0", "--set", "rl.sft_coef=1"])
    assert bench.sft_set(lone) == (tmp_path / "distill" / "kept.jsonl").resolve()
    run = tmp_path / "run"
    (run / "sft" / "adapter").mkdir(parents=True)
    (run / "distill").mkdir()
    (run / "distill" / "kept.jsonl").write_text("{}\n")
    assert bench.sft_set(run / "sft" / "adapter") == (run / "distill" / "kept.jsonl").resolve()
    # without the mix nothing is read from beside the adapter: the check lets it through to the work
    with pytest.raises(pytest.fail.Exception, match="work began"):
        bench.main(["--sft-adapter", str(lone), "--seeds", "0", "--set", "rl.sft_coef=0"])


def test_arms_refuse_the_confirmation_split_without_final_and_unknown_arms(bench, tmp_path, monkeypatch):
    monkeypatch.setenv("COA_LAB_RUNS", str(tmp_path / "runs"))
    monkeypatch.setattr(bench.pipeline, "draw_tasks", lambda *a, **k: pytest.fail("work began"))
    run = tmp_path / "run"
    (run / "sft" / "adapter").mkdir(parents=True)
    (run / "distill").mkdir()
    (run / "distill" / "kept.jsonl").write_text("{}\n")
    adapter = str(run / "sft" / "adapter")
    with pytest.raises(SystemExit, match="--final"):
        bench.main(["--sft-adapter", adapter, "--arms", "rl", "--split", "confirm"])
    with pytest.raises(SystemExit, match="--arms --final only"):
        bench.main(["--sft-adapter", adapter, "--split", "confirm"])
    from benchmarks import rl_arms

    with pytest.raises(SystemExit, match="unknown arm"):
        rl_arms.arm_overrides("ppo", {}, 0)
    assert rl_arms.arm_overrides("control", {"rl": {"steps": 4}}, 3) == {
        "rl": {"steps": 4, "pg_coef": 0.0, "sft_coef": 1.0, "seed": 3}}
    assert rl_arms.arm_overrides("rl", {}, 1) == {"rl": {"sft_coef": 0.0, "seed": 1}}
    assert rl_arms.sft_mixing(["rl", "control", "rl+ptx"]) == ["control", "rl+ptx"]
    # each arm names its SFT mix: a preset without one still runs the control, from an adapter with its SFT set...
    with pytest.raises(pytest.fail.Exception, match="work began"):
        bench.main(["--sft-adapter", adapter, "--arms", "control", "--split", "val", "--set", "rl.sft_coef=0"])
    # ...and an adapter without it is refused for the arms that read it, not for `rl`
    lone = tmp_path / "copied" / "adapter"
    lone.mkdir(parents=True)
    with pytest.raises(SystemExit, match="kept.jsonl is missing"):
        bench.main(["--sft-adapter", str(lone), "--arms", "rl+ptx", "--split", "val"])
    with pytest.raises(pytest.fail.Exception, match="work began"):
        bench.main(["--sft-adapter", str(lone), "--arms", "rl", "--split", "val"])


def test_arms_summary_pairs_outcomes_by_task(bench, tmp_path):
    import argparse

    from benchmarks import rl_arms

    base = tmp_path / "arms"
    (base / "scores").mkdir(parents=True)
    sft = {"scores": {"a": 1.0, "b": 0.0, "c": 0.0, "d": 1.0}, "accuracy": 0.5, "format_valid": 1.0,
           "by_benchmark": {"math/arith": 0.5}}
    extra = {"format_valid": 1.0, "by_benchmark": {}, "rollouts": 0, "optimizer_steps": 16, "sample_seconds": 0.0,
             "update_seconds": 1.0, "eval_seconds": 1.0, "train_accuracy_by_step": [], "entropy_by_step": [],
             "logprob_gap_by_step": []}
    for arm, seed, scores in (("control", 0, {"a": 1.0, "b": 1.0, "c": 0.0, "d": 1.0}),
                              ("rl+ptx", 0, {"a": 1.0, "b": 1.0, "c": 1.0, "d": 0.0})):
        (base / "scores" / f"{arm}_seed{seed}.json").write_text(json.dumps({"arm": arm, "seed": seed, "scores": scores,
                                                                            "accuracy": 0.75, **extra}))
    args = argparse.Namespace(preset="cpu-tiny", set=[], split="val")
    out = rl_arms.summarize(args, {}, base, sft, {"math/arith": 4}, {})
    assert out["task_ids"] == ["a", "b", "c", "d"] and out["sft"]["outcomes"] == [1.0, 0.0, 0.0, 1.0]
    assert out["arms"]["control"]["gains"] == [0.25] and out["arms"]["rl+ptx"]["gains"] == [0.25]
    assert out["arms"]["rl+ptx"]["won"] == [2] and out["arms"]["rl+ptx"]["lost"] == [1]
    assert out["rl_ptx_minus_control"]["by_seed"] == [0.0]  # same accuracy, different tasks: a tie
    assert out["arms"]["rl+ptx"]["outcomes"] == {"0": [1.0, 1.0, 1.0, 0.0]}
