"""Where the lab reads shipped data and writes caches and runs.

Everything the lab needs at run time is inside the project (``datasets/``) or in the
cache directory; nothing reads ``../shared``.
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# The shipped, license-tracked data subsets (see datasets/README.md).
DATASETS_DIR = Path(os.environ.get("COA_LAB_DATASETS", PROJECT_ROOT / "datasets"))
# accelerate launch configs (DDP, FSDP, DeepSpeed) and the SLURM example: docs/scaling.md
CONFIGS_DIR = PROJECT_ROOT / "configs"


def cache_dir() -> Path:
    """Converted models and search indexes; override with COA_LAB_CACHE."""
    path = Path(os.environ.get("COA_LAB_CACHE", Path.home() / ".cache" / "coa-lab"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def runs_dir() -> Path:
    """Where stages write their outputs unless told otherwise; override with COA_LAB_RUNS."""
    return Path(os.environ.get("COA_LAB_RUNS", PROJECT_ROOT / "runs"))
