"""coa_lab/lessons/rl_curve.py: the seeds' band and the steps a trend needs, on made-up logs
with a known slope and noise, and on the committed confirmation logs notebook 04 draws."""

import math

import numpy as np
import pytest

from coa_lab.lessons.rl_curve import committed_steps, seed_band, steps_to_read_a_trend


def logs(slope: float, noise: float, steps: int = 16, seeds: int = 5) -> dict:
    rng = np.random.default_rng(0)
    return {f"seed{s}": [{"step": i, "accuracy": 0.5 + slope * i + noise * rng.standard_normal()}
                         for i in range(steps)] for s in range(seeds)}


def test_the_band_is_the_seeds_mean_and_range():
    steps = {"a": [{"x": 0.2}, {"x": 0.4}], "b": [{"x": 0.6}, {"x": 0.2}]}
    mean, low, high = seed_band(steps, "x")
    assert mean == pytest.approx([0.4, 0.3]) and low == [0.2, 0.2] and high == [0.6, 0.4]


def test_a_noisier_curve_needs_more_steps_and_a_flat_one_has_no_trend():
    quiet, noisy = steps_to_read_a_trend(logs(0.01, 0.02)), steps_to_read_a_trend(logs(0.01, 0.1))
    assert quiet["slope"] == pytest.approx(0.01, abs=0.003)
    assert quiet["steps"] < noisy["steps"]
    n, sigma, slope = noisy["steps"], noisy["sigma"], noisy["slope"]  # the smallest n at 2 standard errors
    assert 2 * sigma * math.sqrt(12 / (n * (n * n - 1))) <= slope < 2 * sigma * math.sqrt(12 / ((n - 1) * ((n - 1) ** 2 - 1)))
    assert steps_to_read_a_trend(logs(-0.01, 0.02))["steps"] is None


def test_the_committed_confirmation_logs_hold_five_seeds_of_the_recipes_sixteen_steps():
    steps = committed_steps()
    assert len(steps) == 5 and {len(rows) for rows in steps.values()} == {16}
    mean, low, high = seed_band(steps, "entropy")
    assert all(lo <= m <= hi for m, lo, hi in zip(mean, low, high))
    assert steps_to_read_a_trend(steps)["steps"] > 3  # the lesson's 3-step run cannot show the trend
