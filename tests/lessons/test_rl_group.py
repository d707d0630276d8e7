"""coa_lab/lessons/rl_group.py: notebook 04's update by hand samples one group as RL samples it, on a
CPU through the int8-attention copy, and every policy token keeps the sampler's log-prob (TIS's input)."""

import dataclasses

import pytest
import torch

from coa_lab.config import get_preset
from coa_lab.lessons.rl_group import group_sampler, sample_group


@pytest.fixture(scope="module")
def lab():
    from coa_lab.generation.models import load_model
    from coa_lab.pipeline import draw_tasks, make_tools

    preset = get_preset("cpu-smoke")
    preset = dataclasses.replace(preset, gen=dataclasses.replace(preset.gen, max_new_tokens=24, max_response_tokens=48))
    policy, tok = load_model(preset.model, trainable=True)
    tasks = draw_tasks(preset, {"math/arith": 2}, "train", skip=preset.capture.tasks)
    return preset, policy, tok, tasks, make_tools(preset)


def test_a_cpu_group_comes_from_the_int8_attention_copy_with_its_logprobs(lab):
    preset, policy, tok, tasks, tools = lab
    generator, name = group_sampler(policy, tok, preset)
    assert name == "int8 attention copy"
    torch.manual_seed(0)
    group, shaped, accuracy = sample_group(policy, tok, tasks, tools, preset, generator=generator)
    assert len(group) == len(shaped) == len(accuracy) == preset.rl.group_size
    assert len({x.task.id for x in group}) == 1
    for x in group:  # a log-prob per response token; the policy's tokens are the ones sampled
        assert len(x.response_logprobs) == len(x.response_ids) == len(x.response_mask)
        assert all(lp < 0 or m == 0 for lp, m in zip(x.response_logprobs, x.response_mask))
    assert set(accuracy) <= {0.0, 1.0}


def test_an_empty_task_list_is_refused(lab):
    preset, policy, tok, _, tools = lab
    with pytest.raises(ValueError, match="at least one task"):
        sample_group(policy, tok, [], tools, preset)
