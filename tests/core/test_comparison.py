"""Paired statistics on hand-made cases: a tie is not a gain, the paired SE by hand, the
bootstrap interval over seeds and tasks (tasks shared by every seed), and the arms table's differences."""

import math

import pytest

from coa_lab.comparison import arms_table, bootstrap_seeds_tasks, paired, paired_block, task_scores


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
    boot = bootstrap_seeds_tasks([(s, s), (s, s)], resamples=500)
    assert boot["mean"] == 0.0 and boot["ci95"] == [0.0, 0.0]


def test_bootstrap_interval_covers_the_mean_and_shrinks_with_more_tasks():
    before = _scores("0" * 20)
    after = _scores("1" * 4 + "0" * 16)
    small = bootstrap_seeds_tasks([(before, after)], resamples=4000)
    big = bootstrap_seeds_tasks([(_scores("0" * 200), _scores("1" * 40 + "0" * 160))], resamples=4000)
    assert small["mean"] == pytest.approx(0.2) and big["mean"] == pytest.approx(0.2)
    assert small["ci95"][0] < 0.2 < small["ci95"][1]
    assert big["ci95"][1] - big["ci95"][0] < small["ci95"][1] - small["ci95"][0]
    # seeds share the tasks: two identical seeds give the same interval as one (no false precision)
    twice = bootstrap_seeds_tasks([(before, after), (before, after)], resamples=4000)
    assert twice["ci95"] == small["ci95"]


def _tasks_only(pairs, **kw):
    """The bootstrap over tasks alone, as the interval was before: one side's seeds averaged per task (one
    'seed'), so only the tasks are resampled."""
    tasks = sorted(pairs[0][0])
    mean = lambda side: {t: sum(p[side][t] for p in pairs) / len(pairs) for t in tasks}  # noqa: E731
    return bootstrap_seeds_tasks([(mean(0), mean(1))], **kw)


def _width(boot) -> float:
    return boot["ci95"][1] - boot["ci95"][0]


def _disagreeing_seeds(rng, seeds: int, tasks: int, spread: float):
    """A start read once and an arm's seeds whose gains differ by seed (each seed solves its own share)."""
    sft = {f"t{i}": float(rng.random() < 0.5) for i in range(tasks)}
    arm = []
    for _ in range(seeds):
        p = 0.1 + spread * rng.random()  # this seed's chance to turn a task right
        arm.append({t: 1.0 if s or rng.random() < p else 0.0 for t, s in sft.items()})
    return [(sft, a) for a in arm]


@pytest.mark.parametrize("case", range(6))
def test_seeds_that_disagree_widen_the_interval_beyond_the_tasks_alone(case):
    import random
    pairs = _disagreeing_seeds(random.Random(case), seeds=5, tasks=120, spread=0.5)
    both, tasks = bootstrap_seeds_tasks(pairs, resamples=4000), _tasks_only(pairs, resamples=4000)
    assert both["mean"] == pytest.approx(tasks["mean"])
    assert _width(both) >= _width(tasks)
    assert both["ci95"][0] <= both["mean"] <= both["ci95"][1]


def test_one_seed_is_the_bootstrap_over_tasks_value_for_value():
    pairs = _disagreeing_seeds(__import__("random").Random(9), seeds=1, tasks=60, spread=0.3)
    assert bootstrap_seeds_tasks(pairs, resamples=3000) == _tasks_only(pairs, resamples=3000)


def test_the_interval_is_the_same_for_the_same_seed_and_moves_with_another():
    pairs = _disagreeing_seeds(__import__("random").Random(3), seeds=4, tasks=80, spread=0.5)
    a, b = bootstrap_seeds_tasks(pairs, resamples=2000, seed=7), bootstrap_seeds_tasks(pairs, resamples=2000, seed=7)
    assert a == b
    assert bootstrap_seeds_tasks(pairs, resamples=2000, seed=8)["ci95"] != a["ci95"]


def test_the_seed_level_spread_is_in_the_interval_by_hand():
    """Tasks that all agree and seeds that do not: the tasks alone see no noise at all, the seeds all of it.
    Two seeds gain 0 and 1 on every task: a resample's seeds give 0, 1/2 or 1 (1/4, 1/2, 1/4)."""
    sft = _scores("0" * 10)
    pairs = [(sft, _scores("0" * 10)), (sft, _scores("1" * 10))]
    assert _tasks_only(pairs, resamples=2000)["ci95"] == [0.5, 0.5]
    both = bootstrap_seeds_tasks(pairs, resamples=2000)
    assert both["mean"] == 0.5 and both["ci95"] == [0.0, 1.0]


def test_two_arms_keep_the_pairing_by_task_and_resample_each_arms_seeds():
    """a − b where both arms gain the same on every task seed by seed: the task draw is shared, so the
    difference is 0 in every resample whatever tasks are drawn; seeds that differ between the arms widen it."""
    tasks = 40
    same = [(_scores("10" * (tasks // 2)), _scores("10" * (tasks // 2))) for _ in range(3)]
    assert bootstrap_seeds_tasks(same, resamples=1000)["ci95"] == [0.0, 0.0]
    b = [_scores("1" * tasks), _scores("0" * tasks), _scores("1" * tasks)]
    a = [_scores("1" * tasks), _scores("1" * tasks), _scores("0" * tasks)]
    pairs = list(zip(b, a))
    boot = bootstrap_seeds_tasks(pairs, resamples=4000)
    assert boot["mean"] == 0.0 and paired_block(pairs, 10)["gains"] == [0.0, 1.0, -1.0]
    # seed k of a is not tied to seed k of b: a's and b's seed means move apart, so the interval is wide
    assert boot["ci95"][0] <= -0.3 and boot["ci95"][1] >= 0.3


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
