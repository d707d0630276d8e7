"""One adapter read on the split's tasks, its per-task outcomes kept on disk.

Greedy (eval.temperature, one answer a task) and, with K samples, at the temperature RL samples
with (rl.temperature): the policy RL trains is the sampled one, and a change there (avg@K, pass@K)
can hide under an unchanged greedy answer. Each file holds every task's outcomes, so any table is
recomputed from the files without a model (table.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from coa_lab import pipeline
from coa_lab.evaluate import evaluate, pass_at_k
from coa_lab.generation.llm import make_generator
from coa_lab.paths import portable_path
from coa_lab.tasks.suites import load_suite

SPLITS = ("val", "test", "selection", "confirm")


def eval_mix(preset, split: str) -> dict[str, int]:
    """The headline families' tasks of a split: `val` eval.val_tasks, `test`/`selection` eval.tasks,
    `confirm` every task of the confirmation split (benchmarks/rl_arms.py reads the same)."""
    keys = list(preset.eval.headline)
    if split == "val":
        return {k: n for k, n in preset.eval.val_tasks.items() if k in keys}
    if split in ("test", "selection"):
        return {k: n for k, n in preset.eval.tasks.items() if k in keys}
    return {k: len(load_suite(k.partition("/")[0], "confirm", benchmark=k.partition("/")[2])) for k in keys}


def task_groups(preset, split: str) -> tuple[dict[str, int], dict[str, list]]:
    mix = eval_mix(preset, split)
    if not mix:
        raise SystemExit(f"coa-lab arms: the {split} split has no tasks of the headline families "
                         f"{list(preset.eval.headline)} in this preset")
    load_split = {"selection": "test"}.get(split, split)
    return mix, pipeline.by_benchmark(pipeline.draw_tasks(preset, mix, load_split), mix)


def _outcomes(records) -> tuple[dict[str, list[float]], dict[str, str], dict[str, float]]:
    """task -> every sample's reward (in order), task -> family, task -> format-valid share."""
    rewards: dict[str, list[float]] = {}
    family: dict[str, str] = {}
    valid: dict[str, list[bool]] = {}
    for r in records:
        rewards.setdefault(r.task_id, []).append(float(r.reward or 0.0))
        family[r.task_id] = r.metadata.get("suite")
        valid.setdefault(r.task_id, []).append(bool(r.metadata.get("valid")))
    return rewards, family, {t: sum(v) / len(v) for t, v in valid.items()}


def read_adapter(preset, adapter: Path, groups: dict, tools, samples: int, label: str) -> dict:
    """Greedy outcomes, and (samples > 0) `samples` answers a task at rl.temperature."""
    t0 = time.time()
    generator = make_generator(preset, adapter)
    greedy = evaluate(generator, groups, tools, preset, label=label, samples=1)
    rewards, family, valid = _outcomes(greedy.records)
    out = {"adapter": portable_path(adapter), "greedy": {t: v[0] for t, v in rewards.items()}, "family": family,
           "format_valid": valid, "samples": samples, "temperature": preset.rl.temperature}
    if samples > 0:
        torch.manual_seed(preset.seed)  # the same draws for every adapter: a re-read gives the same file
        sampled = evaluate(generator, groups, tools, preset, label=label, samples=samples,
                           temperature=preset.rl.temperature)
        out["sampled"], _, out["sampled_format_valid"] = _outcomes(sampled.records)
    out["eval_seconds"] = round(time.time() - t0, 1)
    return out


def metric_scores(entry: dict, metric: str) -> dict[str, float]:
    """Per-task scores of one stored readout: "greedy", "avg_at_K" or "pass_at_K"."""
    if metric == "greedy":
        return dict(entry["greedy"])
    sampled = entry.get("sampled")
    if sampled is None:
        raise KeyError(f"{entry.get('adapter')} was read without samples: no {metric}")
    if metric.startswith("avg_at_"):
        return {t: sum(v) / len(v) for t, v in sampled.items()}
    return {t: pass_at_k(len(v), sum(x == 1.0 for x in v), len(v)) for t, v in sampled.items()}


def write_atomic(path: Path, obj) -> None:
    """Written whole or not at all: a kill mid-write must not leave a file that counts as done."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)
