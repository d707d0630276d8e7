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


def test_seeds_share_the_first_screening_and_append_keeps_sft_and_seeds(bench, tmp_path, monkeypatch):
    """The seed loop's bookkeeping with the model work replaced (pipeline.rl, evaluate): the first seed screens
    the pool, the next trains on that screening, each gain is against the one SFT score, and --append adds a seed
    without scoring SFT or the earlier seeds again."""
    from types import SimpleNamespace

    monkeypatch.setenv("COA_LAB_RUNS", str(tmp_path / "runs"))
    monkeypatch.delenv("COA_LAB_PUBLISH", raising=False)
    machine = {"bf16_autocast": False, "fp32_gflops": 100.0}
    monkeypatch.setattr(bench, "machine_peak", lambda preset: machine)
    monkeypatch.setattr(bench.pipeline, "make_tools", lambda preset: None)
    monkeypatch.setattr(bench, "make_generator", lambda preset, adapter: adapter)
    adapter = tmp_path / "sft" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_model.safetensors").write_bytes(b"weights")
    scored, screened = [], []

    def evaluate(generator, groups, tools, preset, label):
        scored.append(label)
        acc = 0.5 if label == "sft" else 0.5 + 0.01 * (preset.rl.seed + 1)
        suites = {k: SimpleNamespace(tasks=len(v), samples=1, accuracy=acc, format_valid=1.0) for k, v in groups.items()}
        return SimpleNamespace(suites=suites)

    def rl(preset, run, reuse_pool):
        pool = run / "rl" / "pool.json"
        assert reuse_pool == pool.exists()
        if not reuse_pool:
            screened.append(preset.rl.seed)
            pool.parent.mkdir(parents=True)
            pool.write_text(json.dumps({"screened_by": preset.rl.seed}))
        (run / "rl" / "adapter").mkdir()
        return {"metrics": [{"accuracy": 0.5, "entropy": 0.1, "logprob_gap": 0.0}] * 2, "seconds": 1.0}

    monkeypatch.setattr(bench, "evaluate", evaluate)
    monkeypatch.setattr(bench.pipeline, "rl", rl)
    args = ["--sft-adapter", str(adapter), "--split", "val", "--set", "rl.sft_coef=0"]
    assert bench.main([*args, "--seeds", "0", "1"]) == 0
    out = json.loads((tmp_path / "runs" / "bench" / "rl_seeds.json").read_text())
    assert (screened, scored) == ([0], ["sft", "rl", "rl"])
    assert out["seeds"] == [0, 1] and out["pool"] == {"screened_by": 0}
    assert [round(g, 4) for g in out["gains"]] == [0.01, 0.02] and out["targets"]["rl_above_sft"] == 2
    assert bench.main([*args, "--seeds", "0", "1", "2", "--append"]) == 0
    out = json.loads((tmp_path / "runs" / "bench" / "rl_seeds.json").read_text())
    assert (screened, scored[3:]) == ([0], ["rl"])  # seed 2 alone: trained on seed 0's screening
    assert out["seeds"] == [0, 1, 2] and [round(g, 4) for g in out["gains"]] == [0.01, 0.02, 0.03]


def test_arms_train_on_one_screening_and_a_rerun_resumes_from_the_scores(bench, tmp_path, monkeypatch):
    """--arms with the model work replaced: the first arm screens the pool, every other (arm, seed) trains on it,
    a finished RL stage is scored without training again, and a rerun skips an (arm, seed) with a scores file."""
    from types import SimpleNamespace

    import coa_lab.evaluate
    import coa_lab.generation.llm
    import coa_lab.machine

    monkeypatch.setenv("COA_LAB_RUNS", str(tmp_path / "runs"))
    monkeypatch.delenv("COA_LAB_PUBLISH", raising=False)
    monkeypatch.setattr(coa_lab.machine, "machine_peak", lambda preset: {"bf16_autocast": False})
    monkeypatch.setattr(bench.pipeline, "make_tools", lambda preset: None)
    monkeypatch.setattr(coa_lab.generation.llm, "make_generator", lambda preset, adapter: adapter)
    run = tmp_path / "run"
    adapter = run / "sft" / "adapter"
    adapter.mkdir(parents=True)
    (run / "distill").mkdir()
    (run / "distill" / "kept.jsonl").write_text("{}\n")
    scored, trained = [], []

    def evaluate(generator, groups, tools, preset, label):
        scored.append(label)
        records = [SimpleNamespace(task_id=t.id, reward=float(label == "rl" or i % 2), metadata={"suite": k})
                   for k, tasks in groups.items() for i, t in enumerate(tasks)]
        suites = {k: SimpleNamespace(tasks=len(v), samples=1, accuracy=0.5, format_valid=1.0) for k, v in groups.items()}
        return SimpleNamespace(suites=suites, records=records)

    def rl(preset, run_dir, reuse_pool):
        trained.append((run_dir.parent.name, preset.rl.seed, reuse_pool, preset.rl.sft_coef))
        if not reuse_pool:
            (run_dir / "rl").mkdir(parents=True)
            (run_dir / "rl" / "pool.json").write_text(json.dumps({
                "candidates": 2, "samples": 4, "rollouts": 8, "kept": 1, "histogram": {}, "pass_rates": {"t": 0.5}}))
        (run_dir / "rl" / "adapter").mkdir()
        return {"metrics": [{"accuracy": 0.5, "seconds": 2.0, "sample_seconds": 1.0, "sampled_groups": 1}],
                "seconds": 2.0}

    monkeypatch.setattr(coa_lab.evaluate, "evaluate", evaluate)
    monkeypatch.setattr(bench.pipeline, "rl", rl)
    args = ["--sft-adapter", str(adapter), "--split", "val", "--arms", "control", "rl", "--seeds", "0",
            "--set", "rl.steps=1"]
    assert bench.main(args) == 0
    assert trained == [("rl", 0, False, 0.0), ("control", 0, True, 1.0)]  # rl first: its screening is shared
    assert scored == ["sft", "rl", "control"]
    out = json.loads((tmp_path / "runs" / "bench" / "rl_arms.json").read_text())
    assert out["arms"]["rl"]["gains"][0] > 0 and out["arms"]["rl"]["won"][0] > 0
    assert bench.main([*args[:-3], "0", "1", "--set", "rl.steps=1"]) == 0  # seed 1 alone is new work
    assert trained[2:] == [("rl", 1, True, 0.0), ("control", 1, True, 1.0)] and scored[3:] == ["rl", "control"]
