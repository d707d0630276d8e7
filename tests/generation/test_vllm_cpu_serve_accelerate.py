"""The multi-node recipe's RL and evaluation steps (configs/slurm/multinode_32b.sbatch, steps 3 and 4)
on one machine, without NCCL or SLURM: `accelerate launch --config_file configs/ddp.yaml --num_processes 2
-m coa_lab.cli rl --set gen.backend=vllm-server ...` (two CPU ranks over gloo) against a real `vllm serve`
(vLLM's CPU build, the same server tests/generation/test_vllm_cpu_serve.py starts: its `served` fixture),
then `coa-lab eval` through the same server, as the recipe's step 4 runs it: one process.

What must hold: the launch exits 0 (every rank finished), each rank pushed every new adapter to the
server (two load requests per RL step's folder; the server loads it once, under the name both ranks
derive from the folder), RL's summary and metrics are written once, and evaluation reads the base
model and RL's adapter through the server, which loads that adapter from the run folder too.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

from test_vllm_cpu_serve import pytestmark, served  # noqa: F401 - the real `vllm serve` and its skip

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli_sets(server, run: Path) -> list[str]:
    """The recipe's --set flags (gen.backend=vllm-server, the server's URL and key), fp32 as the server
    serves, and an RL step small enough for two 1-thread ranks: one step of 2 questions x 2 samples,
    dynamic sampling off and an overlong window over the 64-token budget (the rollouts' lengths differ,
    so the step's groups carry a reward spread and the update runs), no validation or teacher readout."""
    sets = {"gen.backend": "vllm-server", "gen.server_url": server.url, "gen.server_api_key_env": server.key_env,
            "gen.max_new_tokens": 32, "gen.max_response_tokens": 64, "model.cpu_autocast_bf16": False,
            "rl.steps": 1, "rl.prompts_per_step": 2, "rl.group_size": 2, "rl.dynamic_sampling": False,
            "rl.overlong_buffer": 32, "rl.overlong_filter": False, "rl.learning_rate": 1e-3,
            "eval.val_tasks": {}, "eval.teacher": False}
    out = ["--preset", "cpu-smoke", "--run", str(run)]
    for k, v in sets.items():
        out += ["--set", f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
    return out


def _env() -> dict:
    # no GPU, no progress bars, one thread a rank (2 cores), fp32 as the server computes
    return {**os.environ, "TQDM_DISABLE": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
            "COA_LAB_CPU_BF16": "0"}


def test_rl_under_accelerate_launch_then_eval_against_one_vllm_serve(served, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    # a fresh folder: both ranks record RUN/preset.json while the other may be reading it (cli._record)
    log_start = len(served.logs.read_text())
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "configs" / "ddp.yaml"),
              "--num_processes", "2", "--main_process_port", str(_free_port()),
              "-m", "coa_lab.cli", "rl", *_cli_sets(served, run)]
    done = subprocess.run(launch, check=False, capture_output=True, text=True, timeout=900, env=_env(), cwd=ROOT)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])  # both ranks exited 0
    metrics = [json.loads(line) for line in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0] and "skipped" not in metrics[0]  # rank 0 wrote it, once
    assert metrics[0]["logprob_gap"] < 5e-3, metrics  # the server's policy is the trainer's (fp32)
    assert json.loads((run / "rl" / "summary.json").read_text())["steps"] == 1
    assert (run / "rl" / "adapter" / "adapter_config.json").exists()

    rl_log = served.logs.read_text()[log_start:]
    step0 = str((run / "rl" / "sampler" / "step0").resolve())
    # each rank pushed the update: two load requests from two clients (the second is told it is loaded
    # already, which the lab's client counts as done), one adapter loaded from the run folder
    clients = re.findall(r'(127\.0\.0\.1:\d+) - "POST /v1/load_lora_adapter', rl_log)
    assert len(clients) == len(set(clients)) == 2, rl_log[-3000:]
    assert re.findall(r"Loaded new LoRA adapter: name 'policy-[0-9a-f]+', path '([^']+)'", rl_log) == [step0]

    evaluated = subprocess.run([sys.executable, "-m", "coa_lab.cli", "eval", *_cli_sets(served, run)],
                               check=False, capture_output=True, text=True, timeout=900, env=_env(), cwd=ROOT)
    assert evaluated.returncode == 0, (evaluated.stdout[-2000:], evaluated.stderr[-4000:])
    summary = json.loads((run / "eval" / "summary.json").read_text())
    assert {"base", "rl"} <= summary.keys() and "sft" not in summary  # RL started from the base model
    assert summary["base"] and summary["rl"]
    eval_log = served.logs.read_text()[log_start + len(rl_log):]
    rl_adapter = str((run / "rl" / "adapter").resolve())
    assert f"path '{rl_adapter}'" in eval_log  # evaluation sampled RL's adapter through the same server
    assert "POST /v1/completions" in eval_log
