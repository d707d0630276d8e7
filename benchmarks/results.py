"""Where the benchmarks write what they measured: runs/bench/<name>.json (under COA_LAB_RUNS if set)."""

from __future__ import annotations

import json
from pathlib import Path

from coa_lab.paths import runs_dir


def save(name: str, result: dict) -> Path:
    print(f"machine: {result['machine']}")
    out = runs_dir() / "bench" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return out
