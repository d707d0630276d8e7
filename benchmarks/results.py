"""What the benchmarks share: where they write what they measured (runs/bench/<name>.json,
under COA_LAB_RUNS if set; with COA_LAB_PUBLISH=1, as `make bench` sets it, also the committed
docs/results/<name>.json the README's figures link to) and which of the demo's outputs they reuse."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from coa_lab.paths import runs_dir
from coa_lab.published import provenance, publish


def save(name: str, result: dict) -> Path:
    print(f"machine: {result['machine']}")
    out = runs_dir() / "bench" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {**result, "provenance": provenance(result["machine"])}  # date, commit, probe beside the figures
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    if os.environ.get("COA_LAB_PUBLISH") == "1":  # `make bench`: the figures the README links to
        module = Path(sys.argv[0]).stem  # run as `python -m benchmarks.<module>`
        args = " ".join(sys.argv[1:])
        print(f"published {publish(name, result, f'python -m benchmarks.{module} {args}'.strip(), result['machine'])}")
    return out


def demo_adapter(explicit: Path | None) -> Path | None:
    """The adapter to roll out with: the one given, else the demo's SFT adapter when
    `make demo` has written it (an SFT policy calls tools, so rollouts have several turns)."""
    default = runs_dir() / "demo" / "sft" / "adapter"
    if explicit is None and (default / "adapter_config.json").exists():
        return default
    return explicit
