"""Shared test setup. Nothing in the test suite may reach the network or a model hub."""

import os
import time

import pytest

# Set before transformers/huggingface_hub are imported anywhere: a typo'd model name must
# fail fast with our error, not hang on a connection attempt.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# the teacher's readout is not kept between runs in tests: a stubbed teacher's result must never be
# read back by a real run, nor a real one stand in for a test's stub (tests/capture/test_readout_cache.py
# turns it on in its own cache folder)
os.environ["COA_LAB_TEACHER_CACHE"] = "0"

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


# vLLM's CPU engine declares itself dead when one model step takes over VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS;
# with every xdist worker running a model beside it, gpu-3b-qlora's shrunk run hit the 300 s default
# ("RPC call to execute_model timed out", EngineDeadError). The lab's CPU engine now allows an hour
# (generation/vllm_engine.py); besides, a module marked `vllm_engine` waits for one of two slots, held across
# xdist workers by a file lock in the run's shared temp folder, so that no more engines load the cores at once.
VLLM_SLOTS = 2


@pytest.fixture(scope="module", autouse=True)
def _vllm_engine_slot(request, tmp_path_factory):
    if request.node.get_closest_marker("vllm_engine") is None:
        yield
        return
    from filelock import FileLock, Timeout  # huggingface_hub's dependency: always installed beside transformers

    shared = tmp_path_factory.getbasetemp()
    shared = shared.parent if os.environ.get("PYTEST_XDIST_WORKER") else shared  # the workers' common folder
    locks = [FileLock(str(shared / f"vllm-engine-{k}.lock")) for k in range(VLLM_SLOTS)]
    while True:
        for lock in locks:
            try:
                lock.acquire(timeout=0)
            except Timeout:
                continue
            try:
                yield
            finally:
                lock.release()
            return
        time.sleep(2.0)
