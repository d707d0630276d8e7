"""The teacher's test readout, kept by its inputs so a second evaluation does not run it again.

Evaluation runs the multi-agent teacher on the headline test tasks (the paper's cost comparison).
Its result depends only on the teacher (model, capture and generation settings, seed), the tasks,
the tools, the numeric mode and the lab's code, none of which a re-run of the demo, a notebook
or an arm study changes: every such run paid ~200 s (2026-12-03's demo) for the same readout.
Kept under the cache directory (COA_LAB_CACHE, as converted models are) in a folder named by a
hash of those inputs; any change to them, the lab's own source included, misses.
COA_LAB_TEACHER_CACHE=0 turns it off (the test suite does: its teachers are often stubs). A remote
teacher (capture.teacher_url) is keyed by its URL and model name: a provider that changes the
model behind a name is not seen.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
from pathlib import Path

from coa_lab.config import Preset
from coa_lab.generation.models import numeric_mode
from coa_lab.paths import cache_dir

PACKAGE = Path(__file__).resolve().parents[1]  # coa_lab/


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    """A hash of every Python file of the lab's package: a changed prompt, parser or decoder
    changes what the teacher does."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(str(path.relative_to(PACKAGE)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def readout_key(teacher_preset: Preset, tasks: list, tool_names: list[str]) -> str:
    import torch

    inputs = {
        "model": dataclasses.asdict(teacher_preset.model), "capture": dataclasses.asdict(teacher_preset.capture),
        "gen": dataclasses.asdict(teacher_preset.gen), "seed": teacher_preset.seed,
        "tasks": [[t.id, t.question, list(t.answers), t.profile] for t in tasks], "tools": sorted(tool_names),
        "numeric_mode": numeric_mode(teacher_preset.model), "torch": torch.__version__, "code": code_hash(),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


def enabled() -> bool:
    return os.environ.get("COA_LAB_TEACHER_CACHE", "1") != "0"


def _folder(key: str) -> Path:
    return cache_dir() / "teacher_readouts" / key[:32]


def load(key: str, runs_file: Path) -> dict | None:
    """The kept readout for `key` (its runs copied to `runs_file`), or None. Its `seconds` are 0
    (read back), `first_seconds` the run that computed it, `cached` the key's first 12 digits."""
    if not enabled():
        return None
    folder = _folder(key)
    try:
        kept = json.loads((folder / "readout.json").read_text())
        runs_file.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / "teacher_runs.jsonl", runs_file)
    except (OSError, json.JSONDecodeError):  # absent, or torn by a kill mid-write: read it again
        return None
    # this run spent nothing on it: the first run's seconds are kept beside
    return {**kept, "cached": key[:12], "seconds": 0.0, "first_seconds": kept.get("seconds")}


def store(key: str, kept: dict, runs_file: Path) -> None:
    """Keep `kept` and its runs for `key`; written to a temporary folder, then renamed, so a
    reader never sees half an entry."""
    folder = _folder(key)
    if not enabled() or folder.exists() or not runs_file.exists():
        return
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copyfile(runs_file, tmp / "teacher_runs.jsonl")
    (tmp / "readout.json").write_text(json.dumps(kept, indent=2))
    try:
        tmp.rename(folder)
    except OSError:  # another process kept the same readout first
        shutil.rmtree(tmp, ignore_errors=True)
