"""Notebook 04's update by hand reads its groups from the RL run's own file, rl/rollouts.jsonl
(rl/trainer.py writes every sampled trajectory there after each step), rather than sampling new ones.

The file keeps each rollout's text, task and rewards, not its token ids: `read_groups` turns
each record back into the `Rollout` the update takes, the way the rollout built it: the prompt
is the chat prompt the student was sampled with (run_coa), the response is the text tokenized,
and the response mask is 0 on every token that overlaps an <observation> span (the tools'
words), 1 on the policy's. Token boundaries of re-tokenized text can differ from the sampled
ones at a few places, and the file has no sampler log-probs (so no truncated-importance weight
applies): the group is the run's, the tokens are its text's.
"""

from __future__ import annotations

from pathlib import Path

from coa_lab import protocol
from coa_lab.generation.chat_prompt import chat_prompt_ids
from coa_lab.prompts import task_messages
from coa_lab.student_rollout import Rollout
from coa_lab.tasks.records import Task
from coa_lab.trajectories import load_records


def record_rollout(rec, tokenizer, tools):
    """One rollouts.jsonl record as the `Rollout` the update takes (no sampler log-probs)."""
    task = Task(id=rec.task_id, question=rec.question, answers=list(rec.answers), source=rec.source,
                profile=rec.profile)
    names = [t for t in protocol.PROFILE_TOOLS[rec.profile] if t in tools]  # as run_coa announces them
    prompt = chat_prompt_ids(tokenizer, task_messages(rec.profile, rec.question, names))
    enc = tokenizer(rec.text, add_special_tokens=False, return_offsets_mapping=True)
    spans = protocol.observation_spans(rec.text)
    mask = [0 if any(a < e and b > s for s, e in spans) else 1 for a, b in enc["offset_mapping"]]
    return Rollout(task=task, prompt_ids=list(prompt), response_ids=list(enc["input_ids"]), response_mask=mask,
                   text=rec.text, tool_calls=rec.n_tool_calls, finish=rec.metadata.get("finish", "answer"),
                   truncated=bool(rec.metadata.get("truncated")))


def read_groups(path: str | Path, tokenizer, tools, group_size: int) -> list[tuple[list, list[float]]]:
    """[(group, shaped rewards)] of every group the run sampled, in the order it sampled them.

    A step's records are its groups one after another, `group_size` rollouts each (collect_batch
    samples task by task); the shaped reward (task reward + overlong punishment) is what the
    advantages are computed from."""
    by_step: dict[int, list] = {}
    for rec in load_records(path):
        by_step.setdefault(rec.metadata.get("step", 0), []).append(rec)
    out = []
    for recs in by_step.values():
        if len(recs) % group_size:
            raise ValueError(f"{path}: a step holds {len(recs)} rollouts, not whole groups of {group_size}")
        for i in range(0, len(recs), group_size):
            block = recs[i: i + group_size]
            if len({r.task_id for r in block}) != 1:
                raise ValueError(f"{path}: rollouts {block[0].id}..{block[-1].id} are not one task's group")
            out.append(([record_rollout(r, tokenizer, tools) for r in block],
                        [float(r.metadata.get("shaped_reward", r.reward)) for r in block]))
    return out
