"""`coa-lab arms`: train the arms that are missing, read every adapter, write the paired table.

Layout under OUT (default RUN/arms):
    settings.json          split, tasks, samples, temperatures, start adapter: a second call must match
    pool.json              the ONE screened pool every arm and seed trains on (RUN/rl/pool.json if any)
    runs/<arm>/seed<s>/    each arm's run folder (sft/adapter and distill/ link to the start's)
    scores/sft.json, scores/<arm>_seed<s>.json   per-task outcomes (readout.py); a file = done
    arms.json              the table (table.py), rewritten after every (arm, seed)

Resuming: an (arm, seed) with its scores file is skipped; one whose RL stage finished is only read;
one killed mid-training resumes from its RL checkpoint (rl.save_steps) when it was started with
the same settings, else it restarts from the SFT adapter (its folder removed first)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from coa_lab import pipeline
from coa_lab.config import get_preset, preset_from_dict
from coa_lab.field_types import parse_overrides
from coa_lab.paths import portable_path
from coa_lab.rl.checkpoint import latest_rl_checkpoint
from coa_lab.rl_arms import readout, spec, table

READINGS = Path(__file__).resolve().parents[2] / "docs" / "results" / "confirm_readings.jsonl"


def base_preset(args):
    """The run folder's recorded settings (RUN/preset.json) with --set laid over them, else --preset."""
    overrides = parse_overrides(args.set)
    recorded = args.run / "preset.json" if args.run else None
    if recorded is not None and recorded.exists() and args.preset is None:
        return spec.layered(preset_from_dict(json.loads(recorded.read_text())), overrides)
    return get_preset(args.preset or "cpu-tiny", **overrides)


def finished_rl(run: Path, preset) -> dict | None:
    """The RL summary of a run whose stage ran all its steps (its adapter saved), else None."""
    path = run / "rl" / "summary.json"
    if not path.exists() or not (run / "rl" / "adapter" / "adapter_config.json").exists():
        return None
    summary = json.loads(path.read_text())
    return summary if len(summary.get("metrics", [])) == preset.rl.steps else None


def record_reading(args, mix: dict, preset_name: str, what: list[str]) -> None:
    """The confirmation split is read only for a final recipe, and every reading is on record."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip() or None
    except OSError:
        commit = None
    row = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": commit,
           "benchmark": "coa-lab arms", "out": portable_path((args.out or args.run / "arms").resolve()),
           "preset": preset_name, "overrides": args.set,
           "arms": what, "seeds": args.seeds, "tasks": mix}
    READINGS.parent.mkdir(parents=True, exist_ok=True)
    with READINGS.open("a") as fh:
        fh.write(json.dumps(row) + "\n")
    print(f"confirmation split read: recorded in {READINGS}")


def _check_settings(out: Path, settings: dict) -> None:
    """Every file under OUT pairs with every other: the same tasks, samples, temperatures and numeric
    mode. A field an older settings.json lacks cannot be checked; it is recorded from now on. An older
    file's absolute start is read as the portable path it names (portable_path)."""
    path = out / "settings.json"
    if path.exists():
        old = json.loads(path.read_text())
        if isinstance(old.get("start"), str):
            old["start"] = portable_path(old["start"])
        diff = {k: (old[k], v) for k, v in settings.items() if k in old and old[k] != v}
        if diff:
            hint = (" (pin the numeric mode the earlier readings used: COA_LAB_CPU_BF16=1 for bf16 autocast, "
                    "0 for fp32)" if "numerics" in diff else "")
            raise SystemExit(f"coa-lab arms: {out} was read with other settings {diff} (was, now): its "
                             f"outcomes would not pair with these; give another --out{hint}")
    readout.write_atomic(path, settings)


def _start_info(start: Path) -> dict:
    """The start adapter and, where its run folder says, how it was made (paths: portable_path)."""
    run = start.resolve().parent.parent
    info: dict = {"adapter": portable_path(start.resolve()), "run": portable_path(run)}
    weights = start / "adapter_model.safetensors"
    if weights.exists():
        info["sha256"] = hashlib.sha256(weights.read_bytes()).hexdigest()
    if (run / "preset.json").exists():
        saved = json.loads((run / "preset.json").read_text())
        info["made_by"] = {"preset": saved.get("name"), "sft": saved.get("sft"), "model": saved.get("model")}
    if (run / "sft" / "summary.json").exists():
        s = json.loads((run / "sft" / "summary.json").read_text())
        info["sft_summary"] = {k: s.get(k) for k in ("examples", "first_loss", "last_loss", "seconds")}
    return info


def _prepare_run(run: Path, preset, start: Path, kept: Path, pool: Path) -> bool:
    """Set up (or keep, to resume) one arm's run folder; True when its RL checkpoint resumes."""
    recorded = run / "preset.json"
    now = json.loads(json.dumps(preset.to_dict()))
    if recorded.exists() and json.loads(recorded.read_text()) == now and latest_rl_checkpoint(run / "rl"):
        return True
    pipeline.new_rl_run(run, start, kept.parent, pool)  # a half-made folder of other settings: start clean
    readout.write_atomic(recorded, now)
    return False


def train_arm(preset, run: Path, start: Path, kept: Path, pool: Path) -> tuple[dict, str]:
    """One (arm, seed) trained from the start adapter on the shared pool: (RL summary, how)."""
    summary = finished_rl(run, preset)
    if summary is not None:
        return summary, "finished before"
    resume = _prepare_run(run, preset, start, kept, pool)
    summary = pipeline.rl(preset, run, resume=resume, reuse_pool=pool.exists())
    if not pool.exists():  # the first screening: every later arm and seed trains on it
        shutil.copy(run / "rl" / "pool.json", pool)
    return summary, "resumed" if resume else "trained"
