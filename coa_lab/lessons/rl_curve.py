"""The recipe's RL curve across seeds, for notebook 04: the step logs that `coa-lab arms` committed
for the confirmation split's five `rl` seeds (docs/results/rl_effect.json, confirm.arms.rl.steps),
as a mean with the seeds' range, and how many steps one run needs before its trend can be read.

A lesson's own run is one seed of a few steps; its curve moves by one step's sampling noise
(a step's pool accuracy is ~50 rollouts: ±5 points). The seeds say how large that noise is
beside the trend, so the lesson can say when a learner's curve starts to mean something.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from coa_lab.published import RESULTS_DIR

EFFECT_FILE = RESULTS_DIR / "rl_effect.json"


def committed_steps(path: str | Path = EFFECT_FILE, split: str = "confirm", arm: str = "rl") -> dict[str, list[dict]]:
    """{seed: [step row, ...]}: the per-step log of every seed of `arm` on `split`."""
    steps = json.loads(Path(path).read_text())[split]["arms"][arm]["steps"]
    if not steps or len({len(rows) for rows in steps.values()}) != 1:
        raise ValueError(f"{path}: {split}/{arm} needs step logs of one length for every seed")
    return steps


def seed_band(steps: dict[str, list[dict]], key: str) -> tuple[list[float], list[float], list[float]]:
    """(mean, lowest, highest) of `key` at every step over the seeds."""
    values = np.array([[row[key] for row in rows] for rows in steps.values()], dtype=float)  # [seeds, steps]
    return values.mean(0).tolist(), values.min(0).tolist(), values.max(0).tolist()


def steps_to_read_a_trend(steps: dict[str, list[dict]], key: str = "accuracy", z: float = 2.0) -> dict:
    """How many steps one seed's curve needs before its slope stands `z` standard errors above zero.

    Per seed, a least-squares line through `key` against the step: its slope is the trend, the
    scatter around it (residual standard deviation, sigma) the step-to-step noise. A line through
    n equally spaced steps has a slope standard error of sigma * sqrt(12 / (n (n^2 - 1))); the
    answer is the smallest n where the seeds' mean slope is z of those. Returns the mean slope per
    step, the mean sigma, and n."""
    slopes, sigmas = [], []
    for rows in steps.values():
        y = np.array([row[key] for row in rows], dtype=float)
        x = np.arange(len(y), dtype=float)
        fit = np.polyfit(x, y, 1)
        slopes.append(fit[0])
        sigmas.append(float(np.std(y - np.polyval(fit, x), ddof=2)))
    slope, sigma = float(np.mean(slopes)), float(np.mean(sigmas))
    if slope <= 0:
        return {"slope": slope, "sigma": sigma, "steps": None}  # no rising trend to read
    n = 3
    while z * sigma * math.sqrt(12 / (n * (n * n - 1))) > slope:
        n += 1
    return {"slope": slope, "sigma": sigma, "steps": n}
