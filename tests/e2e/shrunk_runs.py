"""What the shrunk-preset tests share (tests/e2e/test_presets_shrunk*.py): one preset's whole recipe at
CPU size (coa_lab/planning/shrunk.py) through `coa-lab demo`'s stage order, and the checks that the
stages ran the preset's own settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coa_lab import demo, pipeline
from coa_lab.config import get_preset
from coa_lab.machine import vllm_cpu_why_not
from coa_lab.planning.shrunk import cpu_sized, dropped_engines


def needs_vllm(preset) -> None:
    """Skip, with the reason, where the preset samples with vLLM and its CPU build cannot run here."""
    if preset.gen.backend in ("vllm", "vllm-server"):
        why = vllm_cpu_why_not()
        if why:
            pytest.skip(f"{preset.name} samples with vLLM, whose CPU build cannot run here: {why}")


def summaries(run: Path) -> dict:
    return {name: json.loads((run / path).read_text()) for name, path in demo.SUMMARIES.items()
            if (run / path).exists()}


def run_demo_shrunk(name: str, tmp_path: Path) -> dict:
    """`coa-lab demo`'s whole recipe for preset `name` at CPU size, checked stage by stage."""
    full = get_preset(name)
    preset = cpu_sized(full)
    needs_vllm(preset)
    run = tmp_path / name
    demo.run_all(preset, run, log=lambda *_: None)
    s = summaries(run)
    assert list(s) == list(pipeline.STAGES), f"stages that finished: {list(s)}"
    assert s["capture"]["runs"] == sum(preset.capture.tasks.values()) + sum(preset.capture.multi_hop_tasks.values())
    assert 0 < s["distill"]["kept"] <= s["distill"]["input"]
    assert s["sft"]["examples"] == s["distill"]["kept"] and s["sft"]["trained_tokens"] > 0
    assert s["rl"]["steps"] == preset.rl.steps and s["rl"]["pool_candidates"] == sum(preset.rl.pool.values())
    ev = s["eval"]
    assert {"base", "sft", "rl", "control"} <= set(ev), sorted(ev)
    for system in ("base", "sft", "rl", "control"):
        assert set(ev[system]) >= set(preset.eval.tasks), (system, sorted(ev[system]))
    # the preset's settings, not the lab's defaults, are what ran
    saved = json.loads((run / "preset.json").read_text())
    assert saved["rl"]["learning_rate"] == full.rl.learning_rate and saved["gen"]["backend"] == preset.gen.backend
    assert saved["model"]["lora_r"] == full.model.lora_r and saved["model"]["dtype"] == preset.model.dtype
    assert preset.model.dtype == full.model.dtype or (full.model.dtype, preset.model.dtype) == ("bfloat16", "float32")
    swapped = dropped_engines(full)
    assert swapped == (["bitsandbytes 4-bit"] if name == "colab-t4" else
                       ["bitsandbytes 4-bit", "unsloth"] if name == "gpu-3b-qlora" else [])
    return s
