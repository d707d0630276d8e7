"""SFT and RL under `accelerate launch` with two CPU ranks (gloo), against one process.

The launch uses the shipped configs/ddp.yaml unchanged: without CUDA, coa_lab.distributed
joins the ranks over gloo. tests/e2e/distributed_worker.py records, after every optimizer step,
each rank's loss and a SHA-256 of its trainable parameters.

What must hold: the ranks' parameters are bit-identical after every step (the replicas never
drift apart), and the loss curve equals the single-process run that sees the same data:
- SFT: two ranks of batch 1 = one process of batch 1 with 2 accumulation steps (the sampler
  hands rank r every r-th batch of the same seeded order);
- RL: the same rollouts (a scripted policy whose answers do not depend on how rows are split
  over ranks, real code-tool calls), the same groups, the same mini-batches; each rank
  back-propagates half of every mini-batch's micro-batches and the gradients are summed.
Measured here (fp32, one thread per rank): SFT's curve and parameters equal one process's
bit for bit (DDP averages the two ranks' gradients; one process sums its two accumulation
steps: the same additions); RL's first update is bit-identical and later losses differ by
<5e-7 relative (each rank sums half the micro-batches, then the halves are added: another
rounding order). The tolerance, 1e-4, sits well above that and far below what the negative
control (another batch size) moves.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from coa_lab import distributed
from coa_lab.config import get_preset
from coa_lab.lessons.inputs import SHIPPED_TEACHER_RUNS, distill_teacher_runs
from coa_lab.trajectories import load_records, save_records

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "e2e" / "distributed_worker.py"
CONFIGS = ROOT / "configs"
TOL = 1e-4


def _env() -> dict:
    # no GPU may be picked up, no progress bars; the ranks find their peers on loopback
    return {**os.environ, "TQDM_DISABLE": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(*args, ranks: int = 2) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / "ddp.yaml"),
           "--num_processes", str(ranks), "--main_process_port", str(_free_port()), str(WORKER), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env(), cwd=ROOT)


def single(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(WORKER), *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=_env(), cwd=ROOT)


def probes(out: Path, ranks: int) -> list[list[dict]]:
    return [[json.loads(line) for line in (out / f"probe-rank{r}.jsonl").read_text().splitlines()] for r in range(ranks)]


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-5000:])


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("dist_data")
    distill_teacher_runs(get_preset("cpu-smoke"), SHIPPED_TEACHER_RUNS, tmp / "run")
    path = tmp / "kept.jsonl"
    save_records(load_records(tmp / "run" / "distill" / "kept.jsonl")[:8], path)
    return path


@pytest.mark.model
def test_sft_under_accelerate_launch_matches_one_process(tmp_path, records):
    _ok(launch("sft", tmp_path / "two", records))
    rank0, rank1 = probes(tmp_path / "two", 2)
    assert [p["step"] for p in rank0] == [1, 2, 3, 4]  # 8 examples, batch 1 on each of 2 ranks
    assert [p["params"] for p in rank0] == [p["params"] for p in rank1]  # identical replicas, every step
    assert [p["loss"] for p in rank0] == [p["loss"] for p in rank1]

    _ok(single("sft", tmp_path / "one", records, "--accum", "2"))
    (one,) = probes(tmp_path / "one", 1)
    assert [p["loss"] for p in rank0] == pytest.approx([p["loss"] for p in one], rel=TOL)
    assert rank0[0]["loss"] == one[0]["loss"]  # the first step sees the same weights and data: exact

    # the adapter both wrote: the same weights up to the summation order
    from safetensors.torch import load_file

    a = load_file(tmp_path / "two" / "sft" / "adapter" / "adapter_model.safetensors")
    b = load_file(tmp_path / "one" / "sft" / "adapter" / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp(min=1e-12)) for k in a)
    assert worst < TOL, worst
    assert (tmp_path / "two" / "sft" / "trainer" / "checkpoint-4" / "optimizer.pt").exists()  # rank 0 saved

    # resume under the launcher: from checkpoint-2 (as if killed after step 2), steps 3-4 again
    shutil.copytree(tmp_path / "two" / "sft" / "trainer" / "checkpoint-2", tmp_path / "cut" / "sft" / "trainer" / "checkpoint-2")
    _ok(launch("sft", tmp_path / "cut", records, "--resume"))
    r0, r1 = probes(tmp_path / "cut", 2)
    assert [p["step"] for p in r0] == [3, 4] and [p["params"] for p in r0] == [p["params"] for p in r1]
    assert [p["loss"] for p in r0] == pytest.approx([p["loss"] for p in rank0[2:]], rel=TOL)

    # negative control: one process WITHOUT accumulation takes other steps (batch 1, not 2)
    _ok(single("sft", tmp_path / "other", records, "--accum", "1"))
    (other,) = probes(tmp_path / "other", 1)
    assert [p["loss"] for p in other[:4]] != pytest.approx([p["loss"] for p in rank0], rel=TOL)


@pytest.mark.model
def test_rl_under_accelerate_launch_matches_one_process_and_resumes(tmp_path):
    # two ranks: 2 steps, then the same command resumed from its checkpoint to 3
    _ok(launch("rl", tmp_path / "two", "--steps", 2))
    first = probes(tmp_path / "two", 2)
    _ok(launch("rl", tmp_path / "two", "--steps", 3, "--resume"))
    resumed = probes(tmp_path / "two", 2)  # the resumed launch's probes: step 2 only
    rank0, rank1 = first[0] + resumed[0], first[1] + resumed[1]
    assert [p["step"] for p in rank0] == [0, 1, 2]
    assert [p["params"] for p in rank0] == [p["params"] for p in rank1]  # identical replicas, every step
    assert all(p["loss"] is not None for p in rank0)  # every step updated (all groups mixed)
    metrics = [json.loads(x) for x in (tmp_path / "two" / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2]  # rank 0 wrote the run folder, once per step

    _ok(single("rl", tmp_path / "one", "--steps", 3))
    (one,) = probes(tmp_path / "one", 1)
    assert [p["accuracy"] for p in rank0] == [p["accuracy"] for p in one]  # the same rollouts
    assert [p["loss"] for p in rank0] == pytest.approx([p["loss"] for p in one], rel=TOL)  # resumed step included
    assert rank0[0]["params"] == one[0]["params"]  # after the first update: bit-identical here

    # a checkpoint written by two ranks is not resumed by one: its per-rank RNG states say so
    proc = single("rl", tmp_path / "two", "--steps", 4, "--resume")
    assert proc.returncode != 0 and "same number of processes" in proc.stderr


def test_every_shipped_config_loads_and_names_its_engine():
    from accelerate.commands.config.config_args import load_config_from_file

    engines = {}
    for path in sorted(CONFIGS.glob("*.yaml")):
        cfg = load_config_from_file(str(path))
        engines[path.stem] = (str(cfg.distributed_type).split(".")[-1], (cfg.deepspeed_config or {}).get("zero_stage"))
        assert cfg.mixed_precision == "no"  # precision is the preset's (model.dtype), one place
    assert engines == {"ddp": ("MULTI_GPU", None), "fsdp": ("FSDP", None),
                       "zero2": ("DEEPSPEED", 2), "zero3": ("DEEPSPEED", 3)}


def test_shards_cover_every_row_once_in_order(monkeypatch):
    for world in (1, 2, 3, 8):
        for n in (0, 1, 5, 16, 17):
            rows = []
            for r in range(world):
                monkeypatch.setenv("WORLD_SIZE", str(world))
                monkeypatch.setenv("RANK", str(r))
                rows += list(distributed.shard(n))
            assert rows == list(range(n))


def test_rl_refuses_a_sharded_engine_clearly(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    distributed.require_replicated_policy("RL")  # plain data parallel: fine
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(RuntimeError, match="configs/ddp.yaml"):
        distributed.require_replicated_policy("RL")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "false")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(RuntimeError, match="deepspeed"):
        distributed.require_replicated_policy("RL")
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process: nothing is sharded, nothing refused
    distributed.require_replicated_policy("RL")


def test_sharded_engines_refuse_cpu_ranks_instead_of_silently_running_ddp(monkeypatch):
    # accelerate builds FSDP / DeepSpeed only on accelerators: on CPU ranks configs/fsdp.yaml
    # trained plain data parallel (same losses, replicated parameters), so init() refuses it
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(RuntimeError, match="only on GPUs.*configs/ddp.yaml"):
        distributed.require_engine_on_this_hardware(has_cuda=False)
    distributed.require_engine_on_this_hardware(has_cuda=True)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "false")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(RuntimeError, match="deepspeed"):
        distributed.require_engine_on_this_hardware(has_cuda=False)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "false")
    distributed.require_engine_on_this_hardware(has_cuda=False)  # DDP over gloo: what the CPU runs


def test_one_process_collectives_are_identities():
    assert distributed.gather_rows([1, 2]) == [1, 2]
    assert distributed.all_reduce_sum([1.5, 2.0]) == [1.5, 2.0]
    assert distributed.world_size() == 1 and distributed.is_main()
