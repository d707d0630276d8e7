"""Paired statistics on hand-made cases: a tie is not a gain, the paired SE by hand, the
bootstrap interval over tasks shared by seeds, and the arms table's differences."""

import math

import pytest

from coa_lab.comparison import arms_table, bootstrap_mean_gain, paired, task_scores


def _scores(bits: str) -> dict[str, float]:
    return {f"t{i}": float(b) for i, b in enumerate(bits)}


def test_paired_gain_se_and_counts_by_hand():
    before, after = _scores("1100110000"), _scores("1110100001")
    p = paired(before, after)
    # diffs: 0 0 +1 0 0 -1 0 0 0 +1 -> mean 0.1; sample variance (3 * 0.81 + 0.01 * 6 + 1.21) / 9
    assert p["gain"] == pytest.approx(0.1)
    var = (2 * 0.9 ** 2 + 1.1 ** 2 + 7 * 0.1 ** 2) / 9
    assert p["se"] == pytest.approx(math.sqrt(var / 10))
    assert (p["won"], p["lost"], p["tied"]) == (2, 1, 7)
    assert p["before"] == pytest.approx(0.4) and p["after"] == pytest.approx(0.5)


def test_a_tie_is_not_a_gain():
    sft = _scores("1010")
    tie = _scores("0110")  # one won, one lost: the same accuracy
    table = arms_table(sft, {"rl+ptx": {0: tie, 1: _scores("1110")}}, resamples=200)
    arm = table["arms"]["rl+ptx"]
    assert arm["gains"] == [0.0, 0.25]
    assert (arm["above_sft"], arm["ties"], arm["below_sft"]) == (1, 1, 0)
    assert arm["won"] == [1, 1] and arm["lost"] == [1, 0]


def test_identical_policies_have_zero_gain_and_zero_width_interval():
    s = _scores("1100101")
    boot = bootstrap_mean_gain([(s, s), (s, s)], resamples=500)
    assert boot["mean"] == 0.0 and boot["ci95"] == [0.0, 0.0]


def test_bootstrap_interval_covers_the_mean_and_shrinks_with_more_tasks():
    before = _scores("0" * 20)
    after = _scores("1" * 4 + "0" * 16)
    small = bootstrap_mean_gain([(before, after)], resamples=4000)
    big = bootstrap_mean_gain([(_scores("0" * 200), _scores("1" * 40 + "0" * 160))], resamples=4000)
    assert small["mean"] == pytest.approx(0.2) and big["mean"] == pytest.approx(0.2)
    assert small["ci95"][0] < 0.2 < small["ci95"][1]
    assert big["ci95"][1] - big["ci95"][0] < small["ci95"][1] - small["ci95"][0]
    # seeds share the tasks: two identical seeds give the same interval as one (no false precision)
    twice = bootstrap_mean_gain([(before, after), (before, after)], resamples=4000)
    assert twice["ci95"] == small["ci95"]


def test_rl_ptx_minus_control_is_paired_seed_by_seed():
    sft = _scores("00000000")
    control = {0: _scores("11000000"), 1: _scores("10000000")}
    recipe = {0: _scores("11100000"), 1: _scores("10000000")}
    table = arms_table(sft, {"control": control, "rl+ptx": recipe}, resamples=500)
    d = table["rl_ptx_minus_control"]
    assert d["by_seed"] == [0.125, 0.0] and d["mean"] == pytest.approx(0.0625)
    assert d["won"] == [1, 0] and d["lost"] == [0, 0]


def test_different_task_sets_are_refused():
    with pytest.raises(ValueError, match="same tasks"):
        paired(_scores("101"), _scores("1010"))


def test_task_scores_average_samples_and_filter_suites():
    recs = [{"task_id": "a", "reward": 1.0, "metadata": {"suite": "math/arith"}},
            {"task_id": "a", "reward": 0.0, "metadata": {"suite": "math/arith"}},
            {"task_id": "b", "reward": None, "metadata": {"suite": "math/gsm8k"}}]
    assert task_scores(recs) == {"a": 0.5, "b": 0.0}
    assert task_scores(recs, suites=("math/arith",)) == {"a": 0.5}
