"""RL's sampling half (steps 1-3 of rl/trainer.py): roll out a group per prompt with real
tools, score each rollout with the task's scorer (0 for a grammar violation, rl.format_reward) plus
DAPO's soft overlong punishment, and keep sampling until enough groups are informative (dynamic
sampling)."""

from __future__ import annotations

import torch

from coa_lab import protocol
from coa_lab.config import Preset
from coa_lab.rl import dapo
from coa_lab.student_rollout import Rollout, run_coa_across_ranks
from coa_lab.tasks.scorers import reward as task_reward


def rollout_reward(rollout: Rollout, format_gate: bool = True) -> float:
    """The binary verifiable reward: the task's scorer on the final answer (the same scorer
    evaluation reports), and 0 when the trajectory breaks the CoA grammar (format_gate). In the
    paper's runtime a format error aborts the run, so it can never earn a reward; without the
    gate, RL on the cpu-tiny pool taught the student to skip the <think> between <reflection>
    and <answer> (a shorter path that the scorer still paid when the answer happened to be
    right) and turned answers into copies of the reflection; in a one-off probe look-up format
    validity on validation fell from SFT's 0.97 to 0.72 and 0.69 in two seeds (docs/history.md,
    "Why RL fell", which says no result file backs those figures)."""
    if format_gate and protocol.validate(rollout.text, rollout.task.profile):
        return 0.0
    return task_reward(rollout.task, protocol.final_answer(rollout.text))


def score_rollouts(rollouts: list[Rollout], max_len: int, buffer: int,
                   format_gate: bool = True) -> tuple[list[float], list[float]]:
    """(task rewards, shaped rewards): the binary verifiable reward (`rollout_reward`), and
    that reward plus DAPO's soft overlong punishment (what the advantages are computed from).

    The punishment counts the policy's own tokens only (`Rollout.policy_tokens`): a long tool
    output is the environment's doing, and counting it cut correct answers' rewards. max_len is
    gen.max_response_tokens, the one response budget there is, and it bounds the policy's tokens
    too. Generation's cut-off counts observation tokens as well (student_rollout: `truncated` is set
    when policy + observation tokens reach it), so a rollout can be cut by a long observation
    before its policy tokens reach the ramp: it is then flagged truncated (overlong filtering
    masks it) but not punished for the observation."""
    base = [rollout_reward(r, format_gate) for r in rollouts]
    lengths = torch.tensor([r.policy_tokens for r in rollouts])
    shaping = dapo.overlong_penalty(lengths, max_len, buffer).tolist() if buffer > 0 else [0.0] * len(rollouts)
    return base, [b + s for b, s in zip(base, shaping)]


def collect_batch(generator, pool_iter, tools, preset: Preset,
                  anchor_iter=None) -> tuple[list[list[Rollout]], list[list[float]], dict]:
    """Sample groups until `prompts_per_step` informative groups are collected (or rounds run out).

    Dynamic sampling looks at ACCURACY, as DAPO does: a group whose answers are all right or
    all wrong teaches nothing about correctness, even if length shaping makes rewards differ
    (under rl.advantage = "rft" only an all-wrong group is dropped: dapo.informative_groups).
    The first round also samples `anchors_per_step` anchor questions (ones the SFT policy
    always solved): an anchor group only enters the batch if the policy has started to fail it.
    """
    rl, gen = preset.rl, preset.gen
    groups, rewards, stats = [], [], {"sampled_groups": 0, "sampled_rollouts": 0,
                                      # the binary task reward and the shaped one (+ overlong punishment)
                                      "task_reward_sum": 0.0, "shaped_reward_sum": 0.0,
                                      "solved": 0, "tool_calls": 0, "rounds": 0, "samples": [],
                                      "anchor_groups": 0, "anchor_groups_kept": 0, "anchor_solved": 0}
    for round_ in range(rl.max_sampling_rounds + 1):
        need = rl.prompts_per_step - len(groups)
        if need <= 0:
            break
        tasks = [next(pool_iter) for _ in range(need)]
        n_anchors = rl.anchors_per_step if (round_ == 0 and anchor_iter is not None) else 0
        tasks += [next(anchor_iter) for _ in range(n_anchors)]
        need = len(tasks)
        # in a launched run each rank rolls out its share and all get the whole batch back
        rollouts = run_coa_across_ranks(generator, tasks, tools, gen, samples=rl.group_size,
                                        temperature=rl.temperature, progress="sample")
        accuracy, scores = score_rollouts(rollouts, gen.max_response_tokens, rl.overlong_buffer, rl.format_reward)
        stats["rounds"] = round_ + 1
        stats["sampled_groups"] += need
        stats["sampled_rollouts"] += len(rollouts)
        stats["task_reward_sum"] += sum(accuracy)
        stats["shaped_reward_sum"] += sum(scores)
        stats["solved"] += sum(a == 1.0 for a in accuracy)
        stats["tool_calls"] += sum(r.tool_calls for r in rollouts)
        stats["samples"] += list(zip(rollouts, accuracy, scores))
        for g in range(need):
            window = slice(g * rl.group_size, (g + 1) * rl.group_size)
            keep = not rl.dynamic_sampling or bool(dapo.informative_groups(torch.tensor([accuracy[window]]),
                                                                           rl.advantage)[0])
            if g >= need - n_anchors:
                stats["anchor_groups"] += 1
                stats["anchor_groups_kept"] += keep
                stats["anchor_solved"] += sum(a == 1.0 for a in accuracy[window])
            if keep:
                groups.append(rollouts[window])
                rewards.append(scores[window])
        if not rl.dynamic_sampling:
            break
    return groups, rewards, stats
