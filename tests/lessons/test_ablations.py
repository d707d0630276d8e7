"""coa_lab/lessons/ablations.py: the arms switch off exactly one thing, and the measures count right.
(The runs themselves execute in notebook 07's smoke test.)"""

import dataclasses

import pytest

from coa_lab import protocol
from coa_lab.lessons.ablations import DAPO_ARMS, MASKING_ARMS, ROLLOUT_ARMS, arm_summary, rollout_behaviour
from coa_lab.config import RLConfig, get_preset
from coa_lab.trajectories import TrajectoryRecord


def test_each_dapo_arm_is_a_valid_override_that_changes_only_its_technique():
    base = get_preset("cpu-tiny").rl
    assert DAPO_ARMS["DAPO"] == {}
    for arm, overrides in DAPO_ARMS.items():
        rl = get_preset("cpu-tiny", rl=overrides).rl  # unknown fields would raise here
        changed = {f.name for f in dataclasses.fields(RLConfig) if getattr(rl, f.name) != getattr(base, f.name)}
        assert changed == set(overrides), arm
    # no clip arm: at one optimizer step per sampled batch every ratio is 1 and no clip can bind
    assert base.mini_batches == 1 and not any("clip_high" in o or "clip_low" in o for o in DAPO_ARMS.values())
    assert base.dynamic_sampling and base.loss_agg == "token" and base.overlong_buffer > 0 and base.overlong_filter


def test_rollout_arms_change_only_who_samples():
    base = get_preset("cpu-tiny").rl
    assert ROLLOUT_ARMS["exact"] == {} and not base.rollout_int8 and base.tis_cap == 2.0  # the recipe first
    changed = {}
    for arm, overrides in ROLLOUT_ARMS.items():
        rl = get_preset("cpu-tiny", rl=overrides).rl
        changed[arm] = {f.name: getattr(rl, f.name) for f in dataclasses.fields(RLConfig)
                        if getattr(rl, f.name) != getattr(base, f.name)}
    assert changed == {"exact": {}, "int8 + TIS": {"rollout_int8": True},
                       "int8 attention + TIS": {"rollout_int8": "attention"},
                       "int8 attention, no correction": {"rollout_int8": "attention", "tis_cap": None}}


def test_arm_summary_reads_the_per_step_log(tmp_path):
    """Two steps, the second skipped (no update): the per-step lists keep their step, the
    counts add up, and the int8 measures (gap, capped share, sampling time) come through."""
    from coa_lab.trajectories import save_records

    preset = get_preset("cpu-tiny")
    g = preset.rl.group_size
    rows = [{"accuracy": 0.5, "sampled_groups": 3, "kept_groups": 2, "signal_rollouts": 2 * g, "loss": 0.1,
             "clip_frac": 0.01, "high_ratio_frac": 0.002, "response_len_sampled": 120.0, "logprob_gap": 0.1,
             "tis_capped_frac": 0.05, "sample_seconds": 40.0},
            {"accuracy": 1.0, "sampled_groups": 2, "kept_groups": 0, "signal_rollouts": 0,
             "response_len_sampled": 90.0, "sample_seconds": 30.0}]
    limit = preset.gen.max_response_tokens
    save_records([dataclasses.replace(_rec("a", 1.0, True), n_tokens=10), dataclasses.replace(_rec("b", 0.0, True), n_tokens=limit)],
                 tmp_path / "rollouts.jsonl")
    out = arm_summary(preset, {"rollout_int8": True}, rows, tmp_path, 91.26)
    assert out["accuracy"] == [0.5, 1.0] and out["updates"] == 1 and out["sampled_rollouts"] == 5 * g
    assert out["wasted_fraction"] == pytest.approx(1 - 2 / 5) and out["update_signal_fraction"] == 1.0
    assert out["logprob_gap"] == [0.1, None] and out["tis_capped_frac"] == [0.05, None]
    assert out["sample_seconds"] == [40.0, 30.0] and out["seconds"] == 91.3 and out["overlong_rollouts"] == 1


def test_masking_arms_are_on_and_off():
    assert MASKING_ARMS == {"masked": True, "unmasked": False}
    assert get_preset("cpu-tiny").sft.mask_observations is True


def _rec(text, reward, valid):
    return TrajectoryRecord("i", "t", "eval", "math", "q", ["1"], text, reward=reward, metadata={"valid": valid},
                            n_tool_calls=len(protocol.parse(text).tool_calls()))


def test_rollout_behaviour_counts_self_written_observations():
    honest = "<code>print(1)</code>" + protocol.wrap_observation("1") + "<answer>\\boxed{1}</answer>"
    faker = "<think>t</think><observation>1</observation><observation>2</observation><answer>\\boxed{2}</answer>"
    out = rollout_behaviour([_rec(honest, 1.0, True), _rec(faker, 0.0, False), _rec("prose", 0.0, False),
                             _rec(honest, 1.0, True)])
    assert out == {"samples": 4, "accuracy": 0.5, "format_valid": 0.5, "fake_observation_rate": 0.25,
                   "fake_observations": 2, "no_tool_rate": 0.5}


def test_rollout_behaviour_of_nothing():
    assert rollout_behaviour([])["accuracy"] == 0.0


def test_overlong_rollouts_count_the_policys_tokens_not_the_tool_output(tmp_path):
    """The overlong punishment counts the policy's own tokens; so does the arm's count of the
    rollouts it acted on. A record from before policy_tokens was kept counts all its tokens."""
    from coa_lab.trajectories import save_records

    preset = get_preset("cpu-tiny")
    limit = preset.gen.max_response_tokens
    tool_heavy = dataclasses.replace(_rec("a", 1.0, True), n_tokens=limit - 1)
    tool_heavy.metadata.update(policy_tokens=20, truncated=False)
    wordy = dataclasses.replace(_rec("b", 1.0, True), n_tokens=limit - 1)
    wordy.metadata.update(policy_tokens=limit - 1, truncated=False)
    old = dataclasses.replace(_rec("c", 1.0, True), n_tokens=limit - 1)
    save_records([tool_heavy, wordy, old], tmp_path / "rollouts.jsonl")
    row = {"accuracy": 1.0, "sampled_groups": 1, "kept_groups": 0, "signal_rollouts": 0, "response_len_sampled": 9.0}
    assert arm_summary(preset, {}, [row], tmp_path, 1.0)["overlong_rollouts"] == 2  # wordy and old
