"""The gpu-smoke preset (the embedded model on one GPU), the script that runs it on a lent GPU
(benchmarks/gpu_smoke.sh) and what turns its GPU run into a result file."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import import_benchmark

from coa_lab.config import get_preset

ROOT = Path(__file__).resolve().parents[2]
# a stand-in for Python that records each call's arguments; a demo call leaves the SFT adapter and
# pool screening the arms need, so the script goes on to them (nothing is trained)
STUB_PYTHON = """#!/usr/bin/env bash
{ echo CALL; printf '%s\\n' "$@"; } >> "$STUB_LOG"
if [ "$1" = - ]; then cat > /dev/null; exit 0; fi
if [ "$3" = demo ]; then
  while [ $# -gt 0 ]; do
    if [ "$1" = --run ]; then mkdir -p "$2/sft/adapter" "$2/rl" && echo '{}' > "$2/rl/pool.json"; fi
    shift
  done
fi
"""


def _gpu_smoke_calls(tmp_path, **env) -> list[list[str]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    stub = tmp_path / "python"
    stub.write_text(STUB_PYTHON)
    stub.chmod(0o755)
    log = tmp_path / "calls.txt"
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_smoke.sh"), "0"], cwd=ROOT,
                          env={**os.environ, "PYTHON": str(stub), "STUB_LOG": str(log), "OUT": str(tmp_path / "out"),
                               "COA_LAB_RUNS": str(tmp_path / "runs"), **env},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    calls = [c.strip("\n").split("\n") for c in log.read_text().split("CALL\n") if c.strip()]
    return [c for c in calls if c[0] == "-m"]  # the module runs (not the inline checks read from stdin)


def _sets(args: list[str]) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == "--set"]


def test_gpu_smoke_script_passes_set_overrides_and_runs_the_recipes_arms(tmp_path):
    """SET reaches `coa-lab demo` and the arms alike, and the arms are the recipe's `rl` against its control
    (the names the arms benchmark knows, with settings the preset takes)."""
    from benchmarks import rl_arms
    from benchmarks.bench_rl_seeds import _parser
    from coa_lab.cli import _parser as cli_parser
    from coa_lab.field_types import parse_overrides

    demo, arms = _gpu_smoke_calls(tmp_path, SET="gen.batch_size=64 rl.steps=2")
    runs = tmp_path / "runs"
    assert demo[:3] == ["-m", "coa_lab.cli", "demo"]
    parsed = cli_parser().parse_args(demo[2:])
    assert parsed.preset == "gpu-smoke" and parsed.run == runs / "gpu-smoke"
    assert parsed.set == ["gen.batch_size=64", "rl.steps=2"] == _sets(arms)
    preset = get_preset(parsed.preset, **parse_overrides(parsed.set))
    assert preset.gen.batch_size == 64 and preset.rl.steps == 2
    assert arms[:2] == ["-m", "benchmarks.bench_rl_seeds"]
    bench = _parser().parse_args(arms[2:])
    assert bench.arms == ["control", "rl"] and set(bench.arms) <= set(rl_arms.ARMS)
    assert bench.sft_adapter == runs / "gpu-smoke" / "sft" / "adapter"
    assert bench.pool_from == runs / "gpu-smoke" / "rl" / "pool.json" and bench.split == "val"
    rl_arms.sft_mixing(bench.arms)  # every arm known (an unknown one is refused here)
    # no SET: no --set at all (an empty one would be refused by the parser)
    demo, arms = _gpu_smoke_calls(tmp_path / "bare")
    assert "--set" not in demo and "--set" not in arms and "rl+ptx" not in arms


def test_gpu_smoke_is_cpu_tinys_recipe_with_larger_steps():
    """Same filters, SFT rate and RL rates as the measured CPU recipe; what a GPU is for is scale: more than
    twice the rollouts a step, at least cpu-tiny's rollouts a run, in half its steps (its 15-minute plan)."""
    gpu, tiny = get_preset("gpu-smoke"), get_preset("cpu-tiny")
    assert gpu.model.name == tiny.model.name and gpu.model.dtype == "bfloat16" and not gpu.model.load_in_4bit
    assert gpu.distill == tiny.distill
    assert gpu.sft.learning_rate == tiny.sft.learning_rate and gpu.sft.epochs == tiny.sft.epochs
    for field in ("learning_rate", "clip_low", "clip_high", "sft_coef", "temperature", "mini_batches", "pg_coef"):
        assert getattr(gpu.rl, field) == getattr(tiny.rl, field), field

    def rollouts(p):  # questions and anchors, each sampled group_size times, every step
        return p.rl.steps * (p.rl.prompts_per_step + p.rl.anchors_per_step) * p.rl.group_size

    def per_step(p):
        return (p.rl.prompts_per_step + p.rl.anchors_per_step) * p.rl.group_size

    assert per_step(gpu) >= 2 * per_step(tiny) and rollouts(gpu) >= rollouts(tiny)
    assert sum(gpu.capture.tasks.values()) > sum(tiny.capture.tasks.values())
    # the arms benchmark's validation readout
    assert gpu.eval.val_tasks == {"math/arith": 160, "mhqa/lookup": 64}


def test_gpu_smoke_plans_the_whole_recipe_under_15_minutes_on_a_t4():
    """The one-GPU issue's bound, on the planner that counts capture and evaluation too and holds
    the lab's decoder to its pace measured on an H100 (planning/step_time.DECODER_STEP_FLOOR_S)."""
    from coa_lab.planning.step_time import step_time

    t = step_time(get_preset("gpu-smoke"), gpu="T4")
    assert t.capture_hours is not None and t.eval_hours > 0
    assert t.afternoon_hours == t.total_hours + t.capture_hours + t.eval_hours
    assert t.afternoon_hours * 60 <= 15, t.afternoon_hours * 60
    assert t.rl_rollout_bound == "decoder-overhead"  # a 135M model: the decoder, not the T4, sets the pace


def _run_folder(tmp_path, with_pool: bool):
    run = tmp_path / "gpu-smoke"
    (run / "capture").mkdir(parents=True)
    (run / "capture" / "summary.json").write_text(json.dumps(
        {"seconds": 10.0, "runs": 4, "success": {"all": {"accuracy": 0.5}}}))
    (run / "distill").mkdir()
    (run / "distill" / "summary.json").write_text(json.dumps({"input": 4, "kept": 2, "kept_by_source": {"teacher": 2}}))
    if with_pool:
        (run / "rl").mkdir()
        (run / "rl" / "pool.json").write_text(json.dumps(
            {"candidates": 4, "samples": 8, "rollouts": 32, "kept": 2, "histogram": {},
             "pass_rates": {"a": 0.0, "b": 0.25, "c": 0.5, "d": 1.0}}))
    return run


def test_gpu_smoke_publish_reads_the_run_and_names_what_did_not_run(tmp_path):
    publish = import_benchmark("gpu_smoke_publish")
    out = publish.summarize(_run_folder(tmp_path, with_pool=True))
    screening = out["stages"]["pool_screening"]
    assert screening["mean_pass_at_1"] == 0.4375  # (0 + .25 + .5 + 1) / 4
    assert screening["pass_at_k"] == 0.75  # solved at least once: 3 of 4
    assert out["not_reached"] == ["sft", "rl", "eval"]
    bare = publish.summarize(_run_folder(tmp_path / "b", with_pool=False))
    assert "pool_screening" in bare["not_reached"] and "pool_screening" not in bare["stages"]


def test_gpu_smoke_publish_writes_rates_from_the_logged_seconds(tmp_path, monkeypatch):
    import coa_lab.published as published

    publish = import_benchmark("gpu_smoke_publish")
    run = _run_folder(tmp_path, with_pool=True)
    (run / "preset.json").write_text("{}")
    monkeypatch.setattr(published, "RESULTS_DIR", tmp_path / "results")
    assert publish.main([str(run), "--gpu", "X", "--date", "d", "--commit", "c", "--versions", "v",
                         "--stage-seconds", "pool_screening=16", "--name", "probe"]) == 0
    doc = json.loads((tmp_path / "results" / "probe.json").read_text())
    assert doc["stages"]["pool_screening"]["rollouts_per_second"] == 2.0  # 32 rollouts in 16 s
    assert doc["provenance"]["machine"]["gpu"] == "X"


def test_colab_t4_fits_a_t4_and_plans_under_two_hours():
    """The course preset: 4-bit on a 16 GB card, fp16 there (no bf16), the whole recipe planned
    under 2 h, training and rollouts each within the card with the planner's margin."""
    from coa_lab.generation.engine_share import MEMORY_MARGIN
    from coa_lab.generation.model_shape import shape_of
    from coa_lab.planning.memory_plan import plan
    from coa_lab.planning.step_time import step_time

    preset = get_preset("colab-t4")
    assert preset.model.load_in_4bit and preset.model.dtype == "bfloat16"  # fp16 on a T4 by effective_dtype
    t = step_time(preset, gpu="T4")
    assert t.afternoon_hours <= 2, t.afternoon_hours
    m = plan(preset, 1, shape_of(preset.model.name))
    assert m.train_total_gib * MEMORY_MARGIN <= 16 and m.rollout_total_gib * MEMORY_MARGIN <= 16
