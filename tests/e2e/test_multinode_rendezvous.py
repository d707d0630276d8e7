"""Two "machines" on loopback: `accelerate launch --num_machines 2 --machine_rank R
--main_process_ip 127.0.0.1 --main_process_port P --num_processes 2`, started as two separate
launcher processes, one rank each, as configs/slurm/multinode_32b.sbatch starts one launcher per
training node. They run tests/e2e/distributed_worker.py's SFT (LoRA, configs/ddp.yaml, gloo).

What must hold: each launcher ran one rank of its own node (GROUP_RANK = its machine rank,
LOCAL_RANK 0, LOCAL_WORLD_SIZE 1, WORLD_SIZE 2, the master the address given), both finish, the
two ranks' trainable parameters are bit-identical after every step (SHA-256), and the loss curve
equals one process's on the same data (2 ranks x batch 1 = batch 1 x 2 accumulation steps), as
tests/e2e/test_distributed.py measures for two ranks under one launcher.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from coa_lab.config import get_preset
from coa_lab.lessons.inputs import SHIPPED_TEACHER_RUNS, distill_teacher_runs
from coa_lab.serve.stub_teacher import free_port
from coa_lab.trajectories import load_records, save_records

ROOT = Path(__file__).resolve().parents[2]
E2E = ROOT / "tests" / "e2e"
TOL = 1e-4  # tests/e2e/test_distributed.py's

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_engines import rank_env  # noqa: E402

pytestmark = pytest.mark.model


def probes(out: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (out / f"probe-rank{rank}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("rdzv_data")
    distill_teacher_runs(get_preset("cpu-smoke"), SHIPPED_TEACHER_RUNS, tmp / "run")
    path = tmp / "kept.jsonl"
    save_records(load_records(tmp / "run" / "distill" / "kept.jsonl")[:8], path)
    return path


def test_two_launchers_rendezvous_on_loopback_as_two_machines(tmp_path, records):
    port, out = free_port(), tmp_path / "two"
    launchers = []
    for machine in (0, 1):
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ROOT / "configs" / "ddp.yaml"),
               "--num_machines", "2", "--machine_rank", str(machine), "--main_process_ip", "127.0.0.1",
               "--main_process_port", str(port), "--num_processes", "2",
               str(E2E / "multinode_worker.py"), "ddp", str(out), str(records)]
        log = open(tmp_path / f"launcher{machine}.log", "w")
        launchers.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=rank_env(), cwd=ROOT), log))
    for proc, log in launchers:
        try:
            proc.wait(timeout=600)
        finally:
            proc.kill() if proc.poll() is None else None
            log.close()
    for machine, (proc, _) in enumerate(launchers):
        assert proc.returncode == 0, (tmp_path / f"launcher{machine}.log").read_text()[-5000:]

    for rank in (0, 1):  # one rank per launcher, each on its own "node"
        seen = json.loads((out / f"env-rank{rank}.json").read_text())
        assert seen == {"RANK": str(rank), "LOCAL_RANK": "0", "GROUP_RANK": str(rank), "WORLD_SIZE": "2",
                        "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}, seen
    rank0, rank1 = probes(out, 0), probes(out, 1)
    assert [p["step"] for p in rank0] == [1, 2, 3, 4]  # 8 examples, batch 1 on each of 2 ranks
    assert [p["params"] for p in rank0] == [p["params"] for p in rank1]  # identical replicas, every step

    one = tmp_path / "one"
    done = subprocess.run([sys.executable, str(E2E / "distributed_worker.py"), "sft", str(one), str(records),
                           "--accum", "2"], capture_output=True, text=True, timeout=600, env=rank_env(), cwd=ROOT)
    assert done.returncode == 0, done.stderr[-5000:]
    reference = probes(one, 0)
    assert [p["loss"] for p in rank0] == pytest.approx([p["loss"] for p in reference], rel=TOL)
    assert rank0[0]["loss"] == reference[0]["loss"]  # the same weights and data: exact
