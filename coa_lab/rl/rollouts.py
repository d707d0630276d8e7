"""RL's sampling half (steps 1-3 of rl/trainer.py): roll out a group per prompt with real
tools, score each rollout with the task's scorer plus DAPO's soft overlong punishment, and keep
sampling until enough groups are informative (dynamic sampling)."""

from __future__ import annotations

from coa_lab import protocol
from coa_lab.agents.coa_runner import Rollout, run_coa_across_ranks
from coa_lab.config import Preset
from coa_lab.rl import dapo
from coa_lab.tasks.scorers import reward as task_reward


def score_rollouts(rollouts: list[Rollout], max_len: int, buffer: int) -> tuple[list[float], list[float]]:
    """(task rewards, shaped rewards): the binary verifiable reward from the task's scorer, and
    that reward plus DAPO's soft overlong punishment (what the advantages are computed from)."""
    import torch

    base = [task_reward(r.task, protocol.final_answer(r.text)) for r in rollouts]
    lengths = torch.tensor([len(r.response_ids) for r in rollouts])
    shaping = dapo.overlong_penalty(lengths, max_len, buffer).tolist() if buffer > 0 else [0.0] * len(rollouts)
    return base, [b + s for b, s in zip(base, shaping)]


def collect_batch(generator, pool_iter, tools, preset: Preset,
                  anchor_iter=None) -> tuple[list[list[Rollout]], list[list[float]], dict]:
    """Sample groups until `prompts_per_step` informative groups are collected (or rounds run out).

    Dynamic sampling looks at ACCURACY, as DAPO does: a group whose answers are all right or
    all wrong teaches nothing about correctness, even if length shaping makes rewards differ.
    The first round also samples `anchors_per_step` anchor questions (ones the SFT policy
    always solved): an anchor group only enters the batch if the policy has started to fail it.
    """
    import torch

    rl, gen = preset.rl, preset.gen
    groups, rewards, stats = [], [], {"sampled_groups": 0, "sampled_rollouts": 0, "raw_reward_sum": 0.0,
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
        accuracy, scores = score_rollouts(rollouts, gen.max_response_tokens, rl.overlong_buffer)
        stats["rounds"] = round_ + 1
        stats["sampled_groups"] += need
        stats["sampled_rollouts"] += len(rollouts)
        stats["raw_reward_sum"] += sum(scores)
        stats["solved"] += sum(a == 1.0 for a in accuracy)
        stats["tool_calls"] += sum(r.tool_calls for r in rollouts)
        stats["samples"] += list(zip(rollouts, accuracy, scores))
        for g in range(need):
            window = slice(g * rl.group_size, (g + 1) * rl.group_size)
            keep = not rl.dynamic_sampling or bool(dapo.informative_groups(torch.tensor([accuracy[window]]))[0])
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
