"""coa_lab/ablations.py: the arms switch off exactly one thing, and the measures count right.
(The runs themselves execute in notebook 07's smoke test.)"""

import dataclasses

import pytest

from coa_lab import protocol
from coa_lab.ablations import DAPO_ARMS, MASKING_ARMS, rollout_behaviour
from coa_lab.config import RLConfig, get_preset
from coa_lab.trajectories import TrajectoryRecord


def test_each_dapo_arm_is_a_valid_override_that_changes_only_its_technique():
    base = get_preset("cpu-tiny").rl
    assert DAPO_ARMS["DAPO"] == {}
    for arm, overrides in DAPO_ARMS.items():
        rl = get_preset("cpu-tiny", rl=overrides).rl  # unknown fields would raise here
        changed = {f.name for f in dataclasses.fields(RLConfig) if getattr(rl, f.name) != getattr(base, f.name)}
        assert changed == set(overrides), arm
    assert get_preset("cpu-tiny", rl=DAPO_ARMS["no clip-higher"]).rl.clip_high == base.clip_low  # symmetric
    assert base.dynamic_sampling and base.loss_agg == "token" and base.overlong_buffer > 0 and base.overlong_filter


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
