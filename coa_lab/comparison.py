"""Paired comparisons of policies scored on the SAME tasks: what a gain is worth.

Two policies answer the same questions, so the noise of their difference is the noise of the
tasks on which they disagree, not of two accuracies added. Per comparison: the mean per-task
difference (the gain), its paired standard error, and the tasks won and lost (a tie is a tie:
a gain of exactly 0 is neither). Across seeds that share the tasks, the seeds' spread
understates the error (the same questions are read every time), so the interval of the seeds'
mean gain is a bootstrap over tasks: resample the tasks, recompute every seed's gain on them,
average over seeds.

Scores are per-task means in [0, 1] (one greedy answer: 0 or 1; k samples: avg@k).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

Scores = dict[str, float]  # task id -> score


def task_scores(records, suites=None) -> Scores:
    """Per-task mean score from evaluation records (EvalResult.records, or the dicts of an
    `*_trajectories.jsonl`): `suites` keeps the records of those "suite/benchmark" keys only."""
    sums: dict[str, list[float]] = {}
    for rec in records:
        rec = rec if isinstance(rec, dict) else {"task_id": rec.task_id, "reward": rec.reward,
                                                 "metadata": rec.metadata}
        if suites is not None and rec.get("metadata", {}).get("suite") not in suites:
            continue
        sums.setdefault(rec["task_id"], []).append(float(rec["reward"] or 0.0))
    return {t: sum(v) / len(v) for t, v in sums.items()}


def load_task_scores(path: str | Path, suites=None) -> Scores:
    lines = Path(path).read_text().splitlines()
    return task_scores([json.loads(line) for line in lines if line.strip()], suites)


def _common(a: Scores, b: Scores) -> list[str]:
    if set(a) != set(b):
        raise ValueError(f"a paired comparison needs the same tasks on both sides: {len(set(a) ^ set(b))} differ "
                         f"(e.g. {sorted(set(a) ^ set(b))[:3]})")
    return sorted(a)


def paired(before: Scores, after: Scores) -> dict:
    """after − before over the same tasks: gain, paired standard error, tasks won/lost/tied."""
    tasks = _common(before, after)
    n = len(tasks)
    if n < 2:
        raise ValueError(f"a paired comparison needs at least 2 tasks, got {n}")
    diffs = [after[t] - before[t] for t in tasks]
    mean = sum(diffs) / n
    se = (sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) ** 0.5
    return {"tasks": n, "before": sum(before[t] for t in tasks) / n, "after": sum(after[t] for t in tasks) / n,
            "gain": mean, "se": se, "won": sum(d > 0 for d in diffs), "lost": sum(d < 0 for d in diffs),
            "tied": sum(d == 0 for d in diffs)}


def bootstrap_mean_gain(pairs: list[tuple[Scores, Scores]], resamples: int = 10_000, seed: int = 0,
                        level: float = 0.95) -> dict:
    """The mean over seeds of (after − before), each pair one seed's (before, after) on the same
    tasks, with a percentile bootstrap interval over tasks (one task resample shared by every seed,
    since the seeds read the same tasks)."""
    if not pairs:
        raise ValueError("no seeds to average")
    tasks = _common(*pairs[0])
    for before, after in pairs:
        if _common(before, after) != tasks:
            raise ValueError("every seed must be scored on the same tasks")
    diffs = np.array([[after[t] - before[t] for t in tasks] for before, after in pairs])  # [seeds, tasks]
    per_task = diffs.mean(axis=0)  # [tasks]: the seeds' mean gain on each task
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(tasks), size=(resamples, len(tasks)))
    means = per_task[idx].mean(axis=1)  # [resamples]
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return {"seeds": len(pairs), "tasks": len(tasks), "mean": float(per_task.mean()),
            "ci95": [float(lo), float(hi)], "resamples": resamples}


def paired_block(pairs: list[tuple[Scores, Scores]], resamples: int = 10_000) -> dict:
    """One comparison over seeds, each pair one seed's (before, after) on the same tasks: per seed
    the gain, its paired SE and the tasks won and lost; over seeds the mean gain and its bootstrap
    interval over tasks (`coa-lab arms` writes one such block per arm, metric and baseline)."""
    per = [paired(before, after) for before, after in pairs]
    boot = bootstrap_mean_gain(pairs, resamples) if pairs else None
    return {"before": [p["before"] for p in per], "after": [p["after"] for p in per],
            "gains": [p["gain"] for p in per], "paired_se": [p["se"] for p in per],
            "won": [p["won"] for p in per], "lost": [p["lost"] for p in per], "tied": [p["tied"] for p in per],
            "mean": boot["mean"] if boot else None, "ci95": boot["ci95"] if boot else None}


def arms_table(sft: Scores, arms: dict[str, dict[int, Scores]], resamples: int = 10_000) -> dict:
    """Every arm against the SFT start (per seed: accuracy, gain, paired SE, won/lost/tied; over
    seeds: the mean gain and its bootstrap interval), and, when both arms exist, `rl+ptx` − `control`
    seed by seed (the same seed's two adapters): the policy gradient's own effect."""
    out: dict = {"arms": {}}
    for arm, by_seed in arms.items():
        seeds = sorted(by_seed)
        per = [paired(sft, by_seed[s]) for s in seeds]
        boot = bootstrap_mean_gain([(sft, by_seed[s]) for s in seeds], resamples) if seeds else None
        out["arms"][arm] = {
            "seeds": seeds, "accuracy": [p["after"] for p in per], "gains": [p["gain"] for p in per],
            "paired_se": [p["se"] for p in per], "won": [p["won"] for p in per], "lost": [p["lost"] for p in per],
            "above_sft": sum(p["gain"] > 0 for p in per), "ties": sum(p["gain"] == 0 for p in per),
            "below_sft": sum(p["gain"] < 0 for p in per),
            "mean_gain": boot["mean"] if boot else None, "ci95": boot["ci95"] if boot else None}
    if "rl+ptx" in arms and "control" in arms:
        seeds = sorted(set(arms["rl+ptx"]) & set(arms["control"]))
        if seeds:
            pairs = [(arms["control"][s], arms["rl+ptx"][s]) for s in seeds]
            per = [paired(*p) for p in pairs]
            boot = bootstrap_mean_gain(pairs, resamples)
            out["rl_ptx_minus_control"] = {"seeds": seeds, "by_seed": [p["gain"] for p in per],
                                           "paired_se": [p["se"] for p in per], "won": [p["won"] for p in per],
                                           "lost": [p["lost"] for p in per], "mean": boot["mean"],
                                           "ci95": boot["ci95"]}
    return out
