"""`sbatch`, `srun` and `scontrol` stand-ins that emulate a SLURM allocation of a few nodes on this
one machine, for tests/e2e/test_multinode_sbatch.py (a helper, not a test module).

    install(bin_dir)  # writes the three executables; put bin_dir first on PATH

- `sbatch [--nodes N] SCRIPT ARGS...`: N nodes (else the script's `#SBATCH --nodes`, else 1) named
  127.0.0.1, 127.0.0.2, ... (loopback addresses: every "node" is reachable and can bind, no
  /etc/hosts needed), exported as SLURM_JOB_NODELIST in SLURM's compressed form
  ("127.0.0.[1-3]"), SLURM_JOB_NUM_NODES, SLURM_JOB_ID; prints "Submitted batch job ID" and then,
  unlike SLURM, runs the job in the foreground with bash (stdout/stderr are the caller's, not
  %x-%j.out) and exits with its status.
- `scontrol show hostnames [LIST]`: LIST (default $SLURM_JOB_NODELIST) expanded one name a line.
- `srun [--nodes N] [--nodelist L] [--ntasks N] [--ntasks-per-node N] CMD...`: CMD once per task
  on the step's nodes (the allocation's first N, or L), each with SLURM_PROCID (its rank in the
  step), SLURM_NODEID (its node's index in the allocation), SLURMD_NODENAME, SLURM_STEP_NODELIST,
  SLURM_NTASKS and SLURM_LOCALID set; a one-task step execs CMD (so `kill` of srun's pid reaches it);
  a many-task step waits for all and exits with the first failure, passing SIGTERM on.

Every call appends a JSON line to $SLURM_SHIM_LOG (if set): the tool, its argv and, for srun,
each task's node and ids.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "configs" / "slurm" / "multinode_32b.sbatch"

COMMON = r'''
import json, os, re, sys

def expand(hostlist):
    """SLURM's compressed host list: "a,b", "node[1-3,5]", "127.0.0.[1-3]"."""
    names = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", hostlist):
        m = re.fullmatch(r"(.*)\[([^\]]*)\](.*)", part)
        if not m:
            names.append(part)
            continue
        for rng in m.group(2).split(","):
            lo, _, hi = rng.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                names.append(f"{m.group(1)}{str(i).zfill(len(lo))}{m.group(3)}")
    return names

def log(row):
    path = os.environ.get("SLURM_SHIM_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")

def options(argv, known):
    """Leading SLURM options (--opt=V, --opt V, -X V) until the command; unknown ones are kept as seen."""
    got, i = {}, 0
    while i < len(argv) and argv[i].startswith("-"):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in known and not eq:
            i += 1
            value = argv[i]
        got[known.get(name, name)] = value
        i += 1
    return got, argv[i:]
'''

SBATCH = COMMON + r'''
opts, rest = options(sys.argv[1:], {"--nodes": "nodes", "-N": "nodes", "--job-name": "job_name", "-J": "job_name"})
script, args = rest[0], rest[1:]
nodes = opts.get("nodes")
if nodes is None:
    for line in open(script):
        m = re.match(r"#SBATCH\s+(?:--nodes[= ]|-N\s*)(\d+)", line)
        if m:
            nodes = m.group(1)
            break
n = int(nodes or 1)
job = str(os.getpid())
env = {**os.environ, "SLURM_JOB_NODELIST": f"127.0.0.[1-{n}]" if n > 1 else "127.0.0.1",
       "SLURM_JOB_NUM_NODES": str(n), "SLURM_NNODES": str(n), "SLURM_JOB_ID": job,
       "SLURM_SUBMIT_DIR": os.getcwd()}
log({"tool": "sbatch", "argv": sys.argv[1:], "nodes": n})
print(f"Submitted batch job {job}", flush=True)
os.execvpe("bash", ["bash", script, *args], env)
'''

SCONTROL = COMMON + r'''
argv = sys.argv[1:]
log({"tool": "scontrol", "argv": argv})
if argv[:2] != ["show", "hostnames"]:
    sys.exit(f"scontrol shim: only `scontrol show hostnames [LIST]`, got {argv}")
print("\n".join(expand(argv[2] if len(argv) > 2 else os.environ["SLURM_JOB_NODELIST"])))
'''

SRUN = COMMON + r'''
import signal, subprocess
opts, cmd = options(sys.argv[1:], {"--nodes": "nodes", "-N": "nodes", "--nodelist": "nodelist", "-w": "nodelist",
                                   "--ntasks": "ntasks", "-n": "ntasks", "--ntasks-per-node": "per_node"})
alloc = expand(os.environ["SLURM_JOB_NODELIST"])
nodes = expand(opts["nodelist"]) if "nodelist" in opts else alloc[: int(opts.get("nodes", len(alloc)))]
if "nodes" in opts and len(nodes) != int(opts["nodes"]):
    sys.exit(f"srun shim: --nodes={opts['nodes']} but the node list has {len(nodes)}: {nodes}")
if any(node not in alloc for node in nodes):
    sys.exit(f"srun shim: {nodes} is not within the allocation {alloc}")
if "per_node" in opts:
    tasks = [node for node in nodes for _ in range(int(opts["per_node"]))]
else:
    ntasks = int(opts.get("ntasks", len(nodes)))
    tasks = [nodes[i % len(nodes)] for i in range(ntasks)]
envs = []
for rank, node in enumerate(tasks):
    envs.append({**os.environ, "SLURM_PROCID": str(rank), "SLURM_NODEID": str(alloc.index(node)),
                 "SLURMD_NODENAME": node, "SLURM_STEP_NODELIST": ",".join(nodes), "SLURM_NTASKS": str(len(tasks)),
                 "SLURM_STEP_NUM_NODES": str(len(nodes)), "SLURM_LOCALID": str(tasks[:rank].count(node))})
log({"tool": "srun", "argv": sys.argv[1:], "cmd": cmd,
     "tasks": [{"node": node, "procid": rank, "nodeid": alloc.index(node)} for rank, node in enumerate(tasks)]})
if len(tasks) == 1:
    os.execvpe(cmd[0], cmd, envs[0])
procs = [subprocess.Popen(cmd, env=e) for e in envs]
def forward(sig, frame):
    for p in procs:
        if p.poll() is None:
            p.send_signal(sig)
signal.signal(signal.SIGTERM, forward)
signal.signal(signal.SIGINT, forward)
codes = [p.wait() for p in procs]
sys.exit(next((c for c in codes if c), 0))
'''


def install(bin_dir: str | Path, python: str = sys.executable) -> Path:
    """Write sbatch, srun and scontrol into bin_dir (made if missing), run by `python`."""
    bin_dir = Path(bin_dir)
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, source in (("sbatch", SBATCH), ("srun", SRUN), ("scontrol", SCONTROL)):
        path = bin_dir / name
        path.write_text(f"#!{python}\n{source}")
        path.chmod(0o755)
    return bin_dir


def sbatch(bin_dir: Path, env: dict, cwd: Path, timeout: int, script: Path = SCRIPT) -> subprocess.CompletedProcess:
    """`sbatch configs/slurm/multinode_32b.sbatch` through the shim; the whole job's process group
    is ended afterwards (a server the script left must not outlive the test)."""
    proc = subprocess.Popen([str(bin_dir / "sbatch"), str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the job ran past {timeout} s:\n{out[-3000:]}\n{err[-6000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def expand(hostlist: str) -> list[str]:
    """The shims' host-list expansion, importable (the tests check it)."""
    scope: dict = {}
    exec(COMMON, scope)
    return scope["expand"](hostlist)


if __name__ == "__main__":
    print(install(sys.argv[1] if len(sys.argv) > 1 else os.getcwd()))
