"""RL's sampling half (steps 1-3 of rl/trainer.py): roll out a group per prompt with real
tools, score each rollout with the task's scorer (0 for a grammar violation, rl.format_reward) plus
DAPO's soft overlong punishment, and keep sampling until enough groups are informative (dynamic
sampling)."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass
class _Group:
    """One question's sampled group, scored."""
    task: object
    rollouts: list
    accuracy: list[float]
    scores: list[float]
    anchor: bool = False


def _sample_groups(generator, tasks: list, tools, preset: Preset) -> list[_Group]:
    """A group of rl.group_size rollouts per task, in one decode pass, each scored."""
    if not tasks:
        return []
    rl, gen, size = preset.rl, preset.gen, preset.rl.group_size
    # in a launched run each rank rolls out its share and all get the whole batch back
    rollouts = run_coa_across_ranks(generator, tasks, tools, gen, samples=size, temperature=rl.temperature,
                                    progress="sample")
    accuracy, scores = score_rollouts(rollouts, gen.max_response_tokens, rl.overlong_buffer, rl.format_reward)
    return [_Group(task, rollouts[g * size:(g + 1) * size], accuracy[g * size:(g + 1) * size],
                   scores[g * size:(g + 1) * size])
            for g, task in enumerate(tasks)]


def collect_batch(generator, pool_iter, tools, preset: Preset,
                  anchor_iter=None) -> tuple[list[list[Rollout]], list[list[float]], dict]:
    """Sample groups until `prompts_per_step` informative groups are collected (or rounds run out).

    Dynamic sampling looks at ACCURACY, as DAPO does: a group whose answers are all right or
    all wrong teaches nothing about correctness, even if length shaping makes rewards differ
    (under rl.advantage = "rft" only an all-wrong group is dropped: dapo.informative_groups).
    The first round also samples `anchors_per_step` anchor questions (ones the SFT policy
    always solved): an anchor group only enters the batch if the policy has started to fail it.

    Spares (rl.spare_groups): the next round's first questions are sampled in the first round's
    pass, beside it, since a second pass for one or two questions lasts as long as its longest
    rollout. A round takes its questions from the spares first, in the order the pool gave them,
    then from the pool; spares no round took go back to the pool's front (TaskCycle.unread). So
    every round draws the questions, and the policy samples them, as without spares: only the
    passes are fewer. Off in the recipe: on a CPU a decode step costs by its rows, and the spares'
    rows cost more than the second passes they saved (benchmarks/bench_spares.py).
    """
    rl = preset.rl
    groups, rewards, stats = [], [], {"sampled_groups": 0, "sampled_rollouts": 0,
                                      # the binary task reward and the shaped one (+ overlong punishment)
                                      "task_reward_sum": 0.0, "shaped_reward_sum": 0.0,
                                      "solved": 0, "tool_calls": 0, "rounds": 0, "passes": 0, "samples": [],
                                      "anchor_groups": 0, "anchor_groups_kept": 0, "anchor_solved": 0}
    spares: list[_Group] = []  # sampled beside the first round, for the rounds after it
    # spares need a pool that takes questions back (rl/checkpoint.TaskCycle, what train_rl passes)
    n_spares = rl.spare_groups if rl.dynamic_sampling and rl.max_sampling_rounds > 0 and hasattr(pool_iter, "unread") else 0
    for round_ in range(rl.max_sampling_rounds + 1):
        need = rl.prompts_per_step - len(groups)
        if need <= 0:
            break
        ready, spares = spares[:need], spares[need:]
        tasks = [next(pool_iter) for _ in range(need - len(ready))]
        n_anchors = rl.anchors_per_step if (round_ == 0 and anchor_iter is not None) else 0
        tasks += [next(anchor_iter) for _ in range(n_anchors)]
        extra = [next(pool_iter) for _ in range(n_spares if round_ == 0 else 0)]
        sampled = _sample_groups(generator, tasks + extra, tools, preset)
        stats["passes"] += bool(sampled)
        for anchor in sampled[len(tasks) - n_anchors:len(tasks)]:
            anchor.anchor = True
        spares += sampled[len(tasks):]
        _tally(ready + sampled[:len(tasks)], groups, rewards, stats, rl)
        stats["rounds"] = round_ + 1
        if not rl.dynamic_sampling:
            break
    if spares:
        pool_iter.unread([g.task for g in spares])  # they come first at the next step, as if never drawn
    stats["spare_groups_unused"] = len(spares)
    return groups, rewards, stats


def _tally(round_groups: list[_Group], groups: list, rewards: list, stats: dict, rl) -> None:
    """Count one round's groups into `stats` and keep the informative ones (all of them without
    dynamic sampling)."""
    for g in round_groups:
        stats["sampled_groups"] += 1
        stats["sampled_rollouts"] += len(g.rollouts)
        stats["task_reward_sum"] += sum(g.accuracy)
        stats["shaped_reward_sum"] += sum(g.scores)
        stats["solved"] += sum(a == 1.0 for a in g.accuracy)
        stats["tool_calls"] += sum(r.tool_calls for r in g.rollouts)
        stats["samples"] += list(zip(g.rollouts, g.accuracy, g.scores))
        keep = not rl.dynamic_sampling or bool(dapo.informative_groups(torch.tensor([g.accuracy]), rl.advantage)[0])
        if g.anchor:
            stats["anchor_groups"] += 1
            stats["anchor_groups_kept"] += keep
            stats["anchor_solved"] += sum(a == 1.0 for a in g.accuracy)
        if keep:
            groups.append(g.rollouts)
            rewards.append(g.scores)
