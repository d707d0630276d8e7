"""Shared test setup. Nothing in the test suite may reach the network or a model hub."""

import os

# Set before transformers/huggingface_hub are imported anywhere: a typo'd model name must
# fail fast with our error, not hang on a connection attempt.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def import_benchmark(name: str):
    """A script under benchmarks/ as a module (it imports results.py from beside it)."""
    import importlib
    import sys
    from pathlib import Path

    bench = str(Path(__file__).resolve().parent.parent / "benchmarks")
    sys.path.insert(0, bench)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(bench)
