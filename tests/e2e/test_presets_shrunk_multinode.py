"""multinode-32b end to end at CPU size, in its launch script's stage order: capture and distill on one
node, then configs/slurm/multinode_32b.sbatch itself under SLURM shims on loopback. The other presets:
tests/e2e/test_presets_shrunk.py."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from shrunk_runs import needs_vllm, summaries

from coa_lab.config import get_preset
from coa_lab.paths import PROJECT_ROOT
from coa_lab.planning.shrunk import cpu_sized, set_overrides
from coa_lab.recipe_check import require_runnable
from coa_lab.serve.stub_teacher import free_port

E2E = Path(__file__).resolve().parent
sys.path.insert(0, str(E2E))
import slurm_shims  # noqa: E402

pytestmark = [pytest.mark.model, pytest.mark.vllm_engine]

SBATCH = PROJECT_ROOT / "configs" / "slurm" / "multinode_32b.sbatch"
# the rank of RL's LoRA on the full fine-tune, as the script's RL and evaluation steps set it
SBATCH_RL_LORA_R = int(re.search(r"RL_LORA_R=\$\{RL_LORA_R:-(\d+)\}", SBATCH.read_text()).group(1))


def _coa_lab(*args: str, env: dict) -> None:
    done = subprocess.run([sys.executable, "-m", "coa_lab.cli", *args], capture_output=True, text=True, env=env,
                          cwd=PROJECT_ROOT, timeout=1800)
    assert done.returncode == 0, (args[0], done.stdout[-2000:], done.stderr[-4000:])


def test_multinode_32b_runs_its_sbatch_script_shrunk(tmp_path):
    """Capture and distill on one node (the script's header; its teacher through the lab's decoder), then configs/slurm/multinode_32b.sbatch itself
    under srun/scontrol/sbatch shims on loopback (tests/e2e/slurm_shims.py): ZeRO-3 full fine-tune on two
    training "nodes" of one rank each (FSDP2 where DeepSpeed is not installed; the engine applied on CPU
    ranks as in test_multinode_engines.py), vLLM's CPU build serving the SFT model, RL as a LoRA sampling
    from it, evaluation through it. PRESET and SET are the preset and its CPU size (shrunk.set_overrides);
    RL_SET="" keeps RL's base in the preset's dtype (the script's default 4-bit learner needs CUDA)."""
    full = get_preset("multinode-32b")
    preset = cpu_sized(full)
    needs_vllm(preset)
    assert preset.gen.backend == "vllm-server" and preset.model.lora_r == 0
    require_runnable(preset)
    run, sets = tmp_path / "32b", [a for item in set_overrides(preset) for a in ("--set", item)]
    env = {**os.environ, "TQDM_DISABLE": "1", "CUDA_VISIBLE_DEVICES": ""}
    # one node's capture: the recipe names a teacher endpoint (capture.teacher_url); here the local teacher
    # decodes with the lab's decoder, as the preset's own backend is a server that SFT has yet to make
    # The embedded 135M teacher solves none of 2 GSM8K and 2 HotpotQA tasks, so distillation would keep
    # nothing: the SFT set also takes the preset's own imported sources (FireAct, R1-Searcher, ToRA), 2 a
    # file as the rule's counts, where the preset imports none (its teacher is a strong endpoint)
    one_node = [*sets, "--set", "gen.backend=hf", "--set", "distill.imported_per_suite=2"]
    _coa_lab("capture", "--preset", full.name, "--run", str(run), *one_node, env=env)
    _coa_lab("distill", "--preset", full.name, "--run", str(run), *one_node, env=env)

    bin_dir = slurm_shims.install(tmp_path / "bin")
    env.update({
        "PATH": f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "RUN": str(run), "PRESET": full.name, "SET": " ".join(one_node), "RL_SET": "",
        "GPUS_PER_NODE": "1", "TP": "1", "MAX_MODEL_LEN": "2048", "PORT": str(free_port()),
        "MASTER_PORT": str(free_port()),
        "SFT_CONFIG": "configs/zero3.yaml" if importlib.util.find_spec("deepspeed") else "configs/fsdp.yaml",
        "VLLM_SERVE": f"{sys.executable} -m vllm.entrypoints.openai.api_server --model",
        "VLLM_ARGS": "--dtype float32", "VLLM_CPU_KVCACHE_SPACE": "1", "COA_LAB_TEST_CPU_ENGINE": "1",
        "PYTHONPATH": os.pathsep.join([str(E2E / "cpu_engine_site"), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1", "SLURM_SHIM_LOG": str(tmp_path / "slurm.jsonl")})
    done = slurm_shims.sbatch(bin_dir, env, PROJECT_ROOT, timeout=2400)
    (tmp_path / "job.log").write_text(done.stdout + "\n----- stderr\n" + done.stderr)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-8000:])

    s = summaries(run)
    assert s["capture"]["runs"] == sum(preset.capture.tasks.values())
    assert s["sft"]["examples"] == s["distill"]["kept"] > 0
    assert (run / "sft" / "adapter" / "config.json").exists()  # the full fine-tune: the whole model
    assert s["rl"]["steps"] == 1 and s["rl"]["pool_candidates"] == sum(preset.rl.pool.values())
    assert {"base", "sft", "rl"} <= set(s["eval"]) and set(s["eval"]["rl"]) >= set(preset.eval.tasks)
    recorded = json.loads((run / "preset.json").read_text())  # RL and evaluation ran on the served SFT model
    assert recorded["gen"]["backend"] == "vllm-server" and recorded["model"]["lora_r"] == SBATCH_RL_LORA_R
    assert recorded["rl"]["learning_rate"] == full.rl.learning_rate
    shutil.rmtree(run / "sft" / "adapter", ignore_errors=True)
