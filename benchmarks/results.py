"""What the benchmarks share: where they write what they measured (runs/bench/<name>.json,
under COA_LAB_RUNS if set) and which of the demo's outputs they reuse."""

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


def demo_adapter(explicit: Path | None) -> Path | None:
    """The adapter to roll out with: the one given, else the demo's SFT adapter when
    `make demo` has written it (an SFT policy calls tools, so rollouts have several turns)."""
    default = runs_dir() / "demo" / "sft" / "adapter"
    if explicit is None and (default / "adapter_config.json").exists():
        return default
    return explicit
