"""Paired comparisons of policies scored on the SAME tasks: what a gain is worth.

Two policies answer the same questions, so the noise of their difference is the noise of the
tasks on which they disagree, not of two accuracies added. Per comparison: the mean per-task
difference (the gain), its paired standard error, and the tasks won and lost (a tie is a tie:
a gain of exactly 0 is neither).

Across seeds, two things vary: the questions (another draw of tasks) and the training run (another
seed). The interval of the seeds' mean gain is a two-level bootstrap over both
(`bootstrap_seeds_tasks`): each resample draws the tasks once, shared by every seed and both sides
(the comparison stays paired by task, and the seeds read the same questions, so their spread alone
understates the error), then the seeds of each side. With one seed it is the bootstrap over tasks.

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


def bootstrap_seeds_tasks(pairs: list[tuple[Scores, Scores]], resamples: int = 10_000, seed: int = 0,
                          level: float = 0.95) -> dict:
    """The mean over seeds of (after − before), each pair one seed's (before, after) on the same tasks,
    with a percentile interval from a two-level bootstrap over seeds and tasks.

    Each of `resamples` draws:
      1. the tasks, with replacement, ONCE: every seed of both sides reads the drawn tasks, so a task's
         before and after stay together (the comparison is paired by task) and the seeds keep sharing
         their questions;
      2. the seeds of `after`, with replacement, and on their own the seeds of `before`. A side whose
         readings are all the same (one start read once, against every seed of an arm) is held fixed.
    The statistic is the drawn seeds' mean score on the drawn tasks, `after` minus `before`.

    The seeds of two arms are resampled apart: a seed number gives two arms the same prompt order
    and first rollouts, but their runs part at the first update, and the interval does not lean on
    that pairing (a pairing that held would narrow it). The per-seed figures (paired_block) still
    pair seed k with seed k. With one seed this is the bootstrap over tasks alone, value for value;
    seeds that agree on every task give that interval too, and seeds that disagree widen it."""
    if not pairs:
        raise ValueError("no seeds to average")
    tasks = _common(*pairs[0])
    for before, after in pairs:
        if _common(before, after) != tasks:
            raise ValueError("every seed must be scored on the same tasks")
    after = np.array([[a[t] for t in tasks] for _, a in pairs])  # [seeds, tasks]
    before = np.array([[b[t] for t in tasks] for b, _ in pairs])
    mean = float((after - before).mean(axis=0).mean())  # the seeds' mean gain on each task, over the tasks
    if all(b == pairs[0][0] for b, _ in pairs):  # one reading (the start) against every seed: held fixed
        before = before[:1]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(tasks), size=(resamples, len(tasks)))  # 1. the tasks, shared by every seed and side

    def seed_means(side: np.ndarray) -> np.ndarray:
        """[resamples, tasks]: each resample's drawn seeds' mean score per task (2. one side's seeds)."""
        n = len(side)
        draws = rng.integers(0, n, size=(resamples, n))
        weights = (draws[:, :, None] == np.arange(n)).sum(axis=1) / n  # [resamples, seeds]: times drawn / n
        return weights @ side

    per_task = seed_means(after) - seed_means(before)  # [resamples, tasks]: the drawn seeds' gain per task
    means = np.take_along_axis(per_task, idx, axis=1).mean(axis=1)  # [resamples]: on the drawn tasks
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return {"seeds": len(pairs), "tasks": len(tasks), "mean": mean, "ci95": [float(lo), float(hi)],
            "resamples": resamples}


def paired_block(pairs: list[tuple[Scores, Scores]], resamples: int = 10_000) -> dict:
    """One comparison over seeds, each pair one seed's (before, after) on the same tasks: per seed
    the gain, its paired SE and the tasks won and lost; over seeds the mean gain and its bootstrap
    interval over seeds and tasks (bootstrap_seeds_tasks; `coa-lab arms` writes one such block per arm,
    metric and baseline)."""
    per = [paired(before, after) for before, after in pairs]
    boot = bootstrap_seeds_tasks(pairs, resamples) if pairs else None
    return {"before": [p["before"] for p in per], "after": [p["after"] for p in per],
            "gains": [p["gain"] for p in per], "paired_se": [p["se"] for p in per],
            "won": [p["won"] for p in per], "lost": [p["lost"] for p in per], "tied": [p["tied"] for p in per],
            "mean": boot["mean"] if boot else None, "ci95": boot["ci95"] if boot else None}


def arms_table(sft: Scores, arms: dict[str, dict[int, Scores]], resamples: int = 10_000) -> dict:
    """Every arm against the SFT start (per seed: accuracy, gain, paired SE, won/lost/tied; over
    seeds: the mean gain and its bootstrap interval over seeds and tasks), and, when both arms exist,
    `rl+ptx` − `control` seed by seed (the same seed's two adapters): the policy gradient's own effect."""
    out: dict = {"arms": {}}
    for arm, by_seed in arms.items():
        seeds = sorted(by_seed)
        per = [paired(sft, by_seed[s]) for s in seeds]
        boot = bootstrap_seeds_tasks([(sft, by_seed[s]) for s in seeds], resamples) if seeds else None
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
            boot = bootstrap_seeds_tasks(pairs, resamples)
            out["rl_ptx_minus_control"] = {"seeds": seeds, "by_seed": [p["gain"] for p in per],
                                           "paired_se": [p["se"] for p in per], "won": [p["won"] for p in per],
                                           "lost": [p["lost"] for p in per], "mean": boot["mean"],
                                           "ci95": boot["ci95"]}
    return out
