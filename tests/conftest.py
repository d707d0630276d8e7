"""Shared test setup. Nothing in the test suite may reach the network or a model hub."""

import os

# Set before transformers/huggingface_hub are imported anywhere: a typo'd model name must
# fail fast with our error, not hang on a connection attempt.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Under pytest-xdist (`make test` runs `-n auto`), each worker gets its share of the cores: on a
# 2-core machine two workers of one thread each finish more model work than one process of two
# threads (measured on the lab's decoder: x1.24-1.28; a second thread in one process adds little
# at a small model's sizes; docs/design.md, "The test suite in two workers"). Set before torch starts its thread pool, and
# in the environment so that the notebooks, CLI runs and launches a test starts inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _threads = max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(_threads)
    import torch

    torch.set_num_threads(_threads)


def tiny_sft_records(n: int) -> list:
    """n one-line SFT trajectories ("What is i + 1?"): the SFT mix's rows in the RL tests."""
    from coa_lab.trajectories import TrajectoryRecord

    return [TrajectoryRecord(id=f"sft-{i}", task_id=f"t{i}", source="test", profile="math",
                             question=f"What is {i} + 1?", answers=[str(i + 1)],
                             text=f"<think>{i} plus one.</think><answer>\\boxed{{{i + 1}}}</answer>")
            for i in range(n)]


def import_benchmark(name: str):
    """A script under benchmarks/ as a module: benchmarks.<name> (pytest puts the root on the path)."""
    import importlib

    return importlib.import_module(f"benchmarks.{name}")
