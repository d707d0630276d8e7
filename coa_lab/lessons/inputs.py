"""What each notebook reads: the previous notebook's output when it ran, else a shipped or
quickly rebuilt fallback, so every lesson can be opened on its own.

    01_capture        writes runs/nb01/capture/traces.jsonl
    02_distillation   reads it (fallback: datasets/teacher_runs/, the same capture shipped),
                      writes runs/nb02/distill/kept.jsonl
    03_masked_sft     reads it (fallback: distil the shipped runs), writes runs/nb03/sft/adapter
    04_dapo_rl        reads it (fallback: train that SFT now), writes runs/nb04/rl/adapter
    05_evaluation     reads the SFT and RL adapters that exist
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from coa_lab import pipeline
from coa_lab.config import Preset
from coa_lab.paths import DATASETS_DIR, PROJECT_ROOT, runs_dir
from coa_lab.planning.shrunk import smoke_counts
from coa_lab.published import figure
from coa_lab.training.sft import train_sft
from coa_lab.trajectories import load_records

SHIPPED_TEACHER_RUNS = DATASETS_DIR / "teacher_runs" / "smollm2_135m_cpu_tiny.jsonl"


def lesson_dir(number: int) -> Path:
    """runs/nbNN: where notebook NN writes (COA_LAB_RUNS moves every run folder)."""
    return runs_dir() / f"nb{number:02d}"


def teacher_runs_path() -> Path:
    """Notebook 01's capture if it ran, else the shipped one."""
    captured = lesson_dir(1) / "capture" / "traces.jsonl"
    return captured if captured.exists() and captured.stat().st_size > 0 else SHIPPED_TEACHER_RUNS


def kept_trajectories(preset: Preset) -> list:
    """Notebook 02's kept trajectories; if it has not run, distil the teacher runs now (seconds)."""
    kept = lesson_dir(2) / "distill" / "kept.jsonl"
    if not kept.exists():
        distill_teacher_runs(preset, teacher_runs_path(), lesson_dir(2))
    return load_records(kept)


def distill_teacher_runs(preset: Preset, traces: Path, run: Path) -> dict:
    """`pipeline.distill` on a traces file: copied into run/capture/ first, as the stage expects."""
    target = run / "capture" / "traces.jsonl"
    target.parent.mkdir(parents=True, exist_ok=True)
    if Path(traces).resolve() != target.resolve():
        shutil.copyfile(traces, target)
    return pipeline.distill(preset, run)


def sft_adapter(preset: Preset) -> Path:
    """Notebook 03's SFT adapter; if it has not run, train it now on the kept trajectories
    (cpu-smoke: seconds; cpu-tiny: minutes, the same run notebook 03 makes)."""
    adapter = lesson_dir(3) / "sft" / "adapter"
    if not (adapter / "adapter_config.json").exists():
        train_sft(preset, kept_trajectories(preset), lesson_dir(3) / "sft")
    return adapter


def smoke_sized(preset: Preset) -> Preset:
    """A lesson's smoke mode (COA_LAB_SMOKE=1) for any preset: the preset's model, precision, backend
    and recipe, with its counts cut to cpu-smoke's (2 tasks a family, 1 SFT epoch, 1 RL step of
    2 x 2, no refill draws: coa_lab.planning.shrunk.smoke_counts, the first step of the rule every
    preset's CPU run follows). cpu-smoke comes back as it is; a GPU preset (`PRESET = "gpu-smoke"`)
    then takes each lesson's full-run code path at cpu-smoke's size (tests/lessons/test_gpu_preset.py)."""
    return smoke_counts(preset)


def rl_adapter() -> Path | None:
    """Notebook 04's RL adapter, or None if it has not run."""
    adapter = lesson_dir(4) / "rl" / "adapter"
    return adapter if (adapter / "adapter_config.json").exists() else None


REFERENCE_FIGURES = PROJECT_ROOT / "notebooks" / "figures"


def lesson_figures(number: int) -> Path:
    """Where lesson NN saves its figures: runs/nbNN/figures. The committed reference figures in
    notebooks/figures/, which the lessons' text embeds and quotes, are never overwritten by a
    learner's run; COA_LAB_REFERENCE_FIGURES=1 (a maintainer refreshing them together with the
    prose, benchmarks/bench_notebooks.py) writes there instead."""
    if os.environ.get("COA_LAB_REFERENCE_FIGURES") == "1":
        return REFERENCE_FIGURES
    return lesson_dir(number) / "figures"


def compare_with_reference(saved: Path, inputs: dict[str, str]) -> list[str]:
    """Your run's figure data beside the committed reference's (notebooks/figures/<same name>.json),
    on the inputs that decide what the figure shows (`inputs`: label -> key as published.figure
    reads it, e.g. {"trajectories": "data.examples", "optimizer steps": "len(data.losses)"}).
    Prints which inputs differ, so a learner knows when the text's numbers (the reference run's)
    cannot match the figure above; returns the labels that differ."""
    saved = Path(saved).with_suffix(".json")
    reference = REFERENCE_FIGURES / saved.name
    if not reference.exists() or reference.resolve() == saved.resolve():
        return []
    mine, ref = json.loads(saved.read_text()), json.loads(reference.read_text())

    def value(doc, key):
        try:
            return figure(doc, key)
        except (KeyError, IndexError, TypeError):
            return None

    rows = [(label, value(mine, key), value(ref, key)) for label, key in inputs.items()]
    differ = [label for label, a, b in rows if a != b]
    detail = ", ".join(f"{label} {a} (reference {b})" for label, a, b in rows)
    if differ:
        print(f"Your run differs from the reference run the text describes (notebooks/figures/{reference.name}, "
              f"{ref.get('date')}, commit {ref.get('commit')}) in {', '.join(differ)}: {detail}. "
              "Read the text's figures as the reference's; yours are above.")
    else:
        print(f"Your run has the reference run's inputs ({detail}): the text's figures describe a run like yours.")
    return differ
