"""`make test` runs the suite in pytest-xdist workers; tests/conftest.py gives each its share of
the cores (on 2 cores, two workers of one thread: more model work done than one process of two)."""

import os

import pytest


def test_each_worker_gets_its_share_of_the_cores():
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if not count:
        pytest.skip("not under pytest-xdist (make test runs -n auto; `make test PYTEST_ARGS=-q` runs one process)")
    import torch

    share = max(1, (os.cpu_count() or 1) // count)
    assert torch.get_num_threads() == share
    assert os.environ["OMP_NUM_THREADS"] == str(share)  # what the notebooks and CLI runs a test starts inherit


def test_make_test_keeps_each_file_in_one_worker():
    """The notebooks share one runs folder in file order (notebook 03 reads 02's output), and the
    smoke pipeline's run is built once per file: split across workers they would break or repeat.
    bench_test_suite.py times exactly what `make test` runs."""
    from pathlib import Path

    from conftest import import_benchmark

    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    line = next(line for line in makefile.splitlines() if line.startswith("PYTEST_ARGS ?="))
    args = line.split("?=", 1)[1].strip()
    assert "-n auto" in args and "--dist loadfile" in args
    assert import_benchmark("bench_test_suite").MAKE_TEST_ARGS == args
