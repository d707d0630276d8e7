"""Notebook 04's update by hand takes one group of rollouts sampled the way RL samples them, with
the sampler's log-prob of every token it drew (`Rollout.response_logprobs`): what truncated
importance sampling (TIS) needs, and what a file of texts cannot give back.

On a CPU the group comes from the cheap sampler the lab runs there, an int8 copy of the policy's
attention projections (`rl.rollout_int8 = "attention"`, rl/int8_rollouts.py; notebook 07 measures
what it costs): its probabilities differ from the trainer's, so TIS has real work. On a GPU the
policy samples itself in its compute dtype, and the weights sit near 1.
"""

from __future__ import annotations

from coa_lab.config import Preset
from coa_lab.generation.hf_generator import HFGenerator
from coa_lab.generation.models import compute_context
from coa_lab.rl.int8_rollouts import Int8Rollouts
from coa_lab.rl.rollouts import score_rollouts
from coa_lab.student_rollout import Rollout, run_coa


def group_sampler(policy, tokenizer, preset: Preset):
    """(generator, its name): the int8-attention copy on a CPU, the policy itself elsewhere."""
    if next(policy.parameters()).device.type == "cpu":
        return Int8Rollouts(policy, tokenizer, preset.rl.group_size, which="attention"), "int8 attention copy"
    return (HFGenerator(policy, tokenizer, preset.rl.group_size, compute=lambda: compute_context(policy, preset.model)),
            "the policy itself")


def sample_group(policy, tokenizer, tasks: list, tools, preset: Preset,
                 generator=None) -> tuple[list[Rollout], list[float], list[float]]:
    """(group, shaped rewards, task rewards): `rl.group_size` rollouts of the first task in `tasks`
    whose group has a reward spread (dynamic sampling's test: a group that is all right or all
    wrong has no advantage to learn from), at rl.temperature, scored as RL scores them. Returns
    the last task's group when none has a spread (the caller says so)."""
    generator = generator or group_sampler(policy, tokenizer, preset)[0]
    if not tasks:
        raise ValueError("sample_group needs at least one task")
    rl, gen = preset.rl, preset.gen
    for task in tasks:
        group = run_coa(generator, [task], tools, gen, samples=rl.group_size, temperature=rl.temperature)
        accuracy, shaped = score_rollouts(group, gen.max_response_tokens, rl.overlong_buffer, rl.format_reward)
        if len(set(accuracy)) > 1:
            break
    return group, shaped, accuracy
