"""The demo: the five stages (and RL's control) run one after another into one run folder, then the
report, and an interrupted demo resumed where it stopped (`coa-lab demo [--resume]`). The stages
themselves are coa_lab/pipeline.py's; this file only orders them, times them and keeps what finished.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from coa_lab import pipeline
from coa_lab.config import Preset
from coa_lab.machine import machine_peak
from coa_lab.recipe_check import require_runnable
from coa_lab.report import publish_run, write_report, write_summary

# where each stage leaves its summary: written last, so a stage whose summary exists has finished
SUMMARIES = {"capture": "capture/summary.json", "distill": "distill/summary.json", "sft": "sft/summary.json",
             "rl": "rl/summary.json", "control": "control/rl/summary.json", "eval": "eval/summary.json"}


def finished_stages(preset: Preset, run: Path) -> list[str]:
    """The demo's stages that finished in RUN, in order, up to the first that did not. Only an unbroken
    prefix counts: a stage run again makes every later output stale, and a summary older than an earlier
    stage's is such an output. The control with eval.control off has nothing to do, so it is finished."""
    done, newest = [], 0.0
    for name in pipeline.STAGES:
        if name == "control" and not preset.eval.control:
            done.append(name)
            continue
        path = run / SUMMARIES[name]
        if not path.exists() or path.stat().st_mtime < newest:
            break
        newest = path.stat().st_mtime
        done.append(name)
    return done


def _stage(name: str, resume: bool):
    """The stage `name` as the demo runs it: afresh, or (`resume`) continuing from its own partial work:
    capture's traces, SFT's and RL's checkpoints, evaluation's finished systems. Looked up when called,
    so a test's stand-in for a stage is the one that runs."""
    fns = {"capture": pipeline.capture, "distill": pipeline.distill, "sft": pipeline.sft, "rl": pipeline.rl,
           "control": pipeline.control, "eval": pipeline.evaluate_stage}
    if name in ("capture", "sft", "rl", "eval"):  # the demo's capture starts afresh unless resumed
        return lambda preset, run: fns[name](preset, run, resume=resume)
    return fns[name]  # distill takes a second, the control minutes: both run afresh


def _machine_start(preset: Preset, run: Path, resume: bool) -> dict:
    """The machine's peak at the run's first start (kept in RUN/machine_start.json for a resumed run)."""
    path = run / "machine_start.json"
    if resume and path.exists():
        return json.loads(path.read_text())
    probe = machine_peak(preset)
    pipeline.write_json(path, probe)
    return probe


def run_all(preset: Preset, run: Path, log=print, resume: bool = False) -> dict:
    """The whole recipe, stage after stage; returns per-stage summaries and writes the report.
    `resume`: keep the stages that finished in RUN (finished_stages) and continue the first other one
    from its partial work; every later stage runs afresh. A resumed run's time is then the sum of its
    stages' own seconds (wall time would count the gap between starts), and timing.json says so."""
    run = Path(run)
    # seconds now rather than after capture and SFT: a pool the train split cannot fill, a missing file
    require_runnable(preset)
    run.mkdir(parents=True, exist_ok=True)
    pipeline.write_json(run / "preset.json", preset.to_dict())
    # probed at the start and at the end: on a shared machine the peak drifts within an hour
    # (2026-11-23: 179 -> 84 GFLOP/s between two demo runs), and a stage time means little without it
    machine_start = _machine_start(preset, run, resume)
    kept = finished_stages(preset, run) if resume else []
    first = next((name for name in pipeline.STAGES if name not in kept), None)
    if first and (run / SUMMARIES[first]).exists():  # it finished on older inputs: its partial work is stale
        first = None
    t0 = time.time()
    summaries = {}
    for name in pipeline.STAGES:
        if name in kept:
            path = run / SUMMARIES[name]
            summaries[name] = json.loads(path.read_text()) if path.exists() else {}
            log(f"== {name}: finished before the resume, kept")
            continue
        log(f"== {name} ({preset.name}) ...")
        summaries[name] = _stage(name, resume and name == first)(preset, run)
        log(f"   {name} done in {summaries[name].get('seconds', '?')} s")
    summaries["total_seconds"] = round(time.time() - t0, 1)
    resumed = {"kept": kept, "continued": first} if resume else None  # continued None: the rest ran afresh
    if resume:
        summaries["total_seconds"] = round(sum(s.get("seconds") or 0 for s in summaries.values()
                                               if isinstance(s, dict)), 1)
    timing = {k: v.get("seconds") if isinstance(v, dict) else v for k, v in summaries.items()}
    pipeline.write_json(run / "timing.json", {**timing, "machine": machine_peak(preset),
                                              "machine_start": machine_start, "resumed": resumed})
    write_summary(run, preset)
    write_report(run)
    log(f"report: {run / 'report.md'}  ({summaries['total_seconds']} s)")
    if os.environ.get("COA_LAB_PUBLISH") == "1":  # `COA_LAB_PUBLISH=1 make demo`: docs/results.md's figures
        name = "demo" if preset.name == "cpu-tiny" else f"demo_{preset.name}"
        log(f"published {publish_run(run, name, f'COA_LAB_PUBLISH=1 coa-lab demo --preset {preset.name}')}")
    return summaries
