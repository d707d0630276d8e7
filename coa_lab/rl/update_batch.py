"""One RL step's rollouts as the tensors the update reads (rl/update.py), and how they are cut
into optimizer steps and forwards.

Every rollout is a row: prompt + response token ids, right-padded to the batch's longest.
`loss_mask` is 1 on the tokens the policy wrote and is trained on (observations, the prompt,
padding and, with overlong filtering, truncated samples are 0); `sampler_logprobs` holds the
log-probability the sampler drew each policy token with (0 where it reported none), for the
truncated importance-sampling weights and the sampler/trainer gap check."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from coa_lab.rl.micro_batch import MICRO_BATCH  # noqa: F401 - re-exported: update.py, the tests
from coa_lab.training import packing
from coa_lab.training.logprobs import token_logprobs


def pad(rows: list[list], value) -> torch.Tensor:
    """Right-pad lists of numbers to one tensor [len(rows), longest]."""
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows])


@dataclass
class RolloutBatch:
    flat: list  # the rollouts, group after group
    ids: list[list[int]]  # prompt + response ids of each
    input_ids: torch.Tensor  # [N, W]
    attention: torch.Tensor  # [N, W] 1 on real tokens
    loss_mask: torch.Tensor  # [N, W] 1 on trained policy tokens
    has_sampler_lp: list[bool]  # whether the sampler reported each rollout's log-probs
    sampler_logprobs: torch.Tensor  # [N, W]
    sampler_mask: torch.Tensor  # [N, W] 1 on policy tokens whose sampler log-prob is known
    packed: bool
    temperature: float
    pad_id: int

    @classmethod
    def build(cls, groups, preset, pad_id: int, device, packed: bool) -> RolloutBatch:
        rl = preset.rl
        flat = [r for g in groups for r in g]
        ids = [r.prompt_ids + r.response_ids for r in flat]
        trained = [r.response_mask if not (rl.overlong_filter and r.truncated) else [0] * len(r.response_ids)
                   for r in flat]
        has_lp = [len(r.response_logprobs) == len(r.response_ids) for r in flat]
        zeros = [[0] * len(r.response_ids) for r in flat]
        return cls(
            flat=flat, ids=ids, input_ids=pad(ids, pad_id).to(device),
            attention=pad([[1] * len(x) for x in ids], 0).to(device),
            loss_mask=pad([[0] * len(r.prompt_ids) + m for r, m in zip(flat, trained)], 0).to(device),
            has_sampler_lp=has_lp,
            sampler_logprobs=pad([[0.0] * len(r.prompt_ids) + (r.response_logprobs if ok else [0.0] * len(z))
                                  for r, ok, z in zip(flat, has_lp, zeros)], 0.0).to(device),
            sampler_mask=pad([[0] * len(r.prompt_ids) + (r.response_mask if ok else z)
                              for r, ok, z in zip(flat, has_lp, zeros)], 0).to(device),
            packed=packed, temperature=rl.temperature, pad_id=pad_id)

    @property
    def width(self) -> int:
        return self.input_ids.shape[1]

    def index(self, sub: list[int]) -> torch.Tensor:
        return torch.tensor(sub, device=self.input_ids.device)

    def logprobs(self, model, sub: list[int]) -> torch.Tensor:
        """[len(sub), W] log-probs of rollouts `sub` (one group's: they share a prompt) at the
        sampling temperature, 0 on prompt and padding positions."""
        prompts = [len(self.flat[i].prompt_ids) for i in sub]
        if self.packed:  # the shared prompt once, no padding (coa_lab/training/packing.py)
            return packing.sequence_logprobs(model, [self.ids[i] for i in sub], [list(range(len(sub)))], prompts,
                                             self.pad_id, self.width, temperature=self.temperature)
        # padded to the micro-batch's longest; no prompt token is in the loss: skip their logits
        t, longest = self.index(sub), max(len(self.ids[i]) for i in sub)
        out = token_logprobs(model, self.input_ids[t, :longest], self.attention[t, :longest], min(prompts),
                             temperature=self.temperature)
        return torch.nn.functional.pad(out, (0, self.width - longest))

    def trained_tokens(self, mb: list[list[int]]) -> float:
        """The token-level loss's normaliser: every trained token of a mini-batch, all ranks' shares."""
        return float(self.loss_mask[self.index([i for sub in mb for i in sub])].sum().clamp(min=1))

    def observation_tokens(self) -> int:
        return sum(len(r.response_mask) - sum(r.response_mask) for r in self.flat)


def micro_batches(groups, mini_batches: int) -> list[list[list[int]]]:
    """Rollout indices as mini-batches (one optimizer step each) of micro-batches (one
    forward each). Mini-batches are whole groups in shuffled order, and a micro-batch holds
    up to MICRO_BATCH rollouts of ONE group: they share their prompt, which the packed
    forward then computes once."""
    starts, n = [], 0
    for g in groups:
        starts.append(n)
        n += len(g)
    order = list(range(len(groups)))
    random.shuffle(order)
    size = -(-len(order) // max(1, min(mini_batches, len(order))))  # ceil: at most `mini_batches` steps
    out = []
    for i in range(0, len(order), size):
        micro = []
        for g in order[i : i + size]:
            idx = list(range(starts[g], starts[g] + len(groups[g])))
            micro += [idx[j : j + MICRO_BATCH] for j in range(0, len(idx), MICRO_BATCH)]
        out.append(micro)
    return out


def rank_share(mini_batches: list[list[list[int]]], world: int, me: int) -> list[list[list[int]]]:
    """Data parallel (coa_lab/distributed.py): every rank holds the whole batch and computes
    micro-batches me, me + world, ... of each mini-batch; the gradients are summed before the
    step. One process computes them all: the same sum, in another order."""
    return [[sub for k, sub in enumerate(mb) if k % world == me] for mb in mini_batches]
