"""DAPO (arXiv 2503.14476) as small pure functions on tensors. No model, no I/O: each one is
exercised on toy tensors in notebook 04 and in tests/rl/test_dapo.py.

The four techniques and where they live:
1. clip-higher            -> `dapo_token_loss(clip_low=0.2, clip_high=0.28)` (rl.clip_low, rl.clip_high)
2. dynamic sampling       -> `informative_groups` (drop groups whose rewards are all equal)
3. token-level loss       -> `dapo_token_loss` divides by the batch's token count
4. overlong shaping       -> `overlong_penalty` (soft punishment) + the trainer's mask for
                             truncated samples (overlong filtering)
Advantages are the recipe's by default (rl.advantage, RLConfig's default: Dr. GRPO's reward minus the
group's mean); `advantages` selects the alternatives (GRPO's reward standardized within the group
of samples of one prompt, RFT's 1/0). Every default here is RLConfig's, so a call without
settings computes what the recipe does.
No KL term by default, as in DAPO and the AFM release; `kl_to_reference` is GRPO's, a switch
(rl.kl_coef) that keeps the policy near the SFT one.
"""

from __future__ import annotations

import math

import torch

from coa_lab.config import RLConfig


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantage: (r - mean) / (std + eps) within each group.

    rewards: [n_groups, group_size] -> advantages of the same shape.
    A group where every sample got the same reward has advantage 0 everywhere: no signal.
    """
    mean = rewards.mean(dim=1, keepdim=True)  # [n_groups, 1]
    std = rewards.std(dim=1, keepdim=True, unbiased=False)  # [n_groups, 1]
    return (rewards - mean) / (std + eps)  # [n_groups, group_size]


ADVANTAGES = ("grpo", "dr_grpo", "rft")


def advantages(rewards: torch.Tensor, mode: str = RLConfig.advantage,
               accuracy: torch.Tensor | None = None) -> torch.Tensor:
    """The per-rollout advantage of rl.advantage = `mode`. rewards: [n_groups, G], the shaped
    rewards; accuracy: [n_groups, G], the binary task reward (default: `rewards`).

    "grpo": (r - mean) / std, `group_advantages` (a lone success in a 1-of-4 group gets +1.73,
        a 3-of-4 group's lone failure -1.73: Dr. GRPO's difficulty bias);
    "dr_grpo": r - mean, no std division (Dr. GRPO, arXiv 2503.20783; the default, rl.advantage's);
    "rft": 1 for a correct rollout (accuracy == 1, before overlong shaping), 0 for a wrong one:
        rejection-sampling fine-tuning on the student's own correct rollouts, as an RL arm.
    """
    if mode == "grpo":
        return group_advantages(rewards)
    if mode == "dr_grpo":
        return rewards - rewards.mean(dim=1, keepdim=True)
    if mode == "rft":
        return ((accuracy if accuracy is not None else rewards) == 1.0).to(rewards.dtype)
    raise ValueError(f"rl.advantage must be one of {ADVANTAGES}, got {mode!r}")


def informative_groups(rewards: torch.Tensor, mode: str = RLConfig.advantage) -> torch.Tensor:
    """Dynamic sampling: keep groups whose rewards are not all equal. [n_groups, G] -> bool [n_groups].

    Under rl.advantage = "rft" (`mode`; rewards are then the binary accuracy) a group carries
    signal when any rollout is correct: an all-correct group is kept (its rollouts are trained
    on), only an all-wrong one is dropped."""
    if mode == "rft":
        return rewards.max(dim=1).values == 1.0
    return (rewards.max(dim=1).values - rewards.min(dim=1).values) > 0


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int) -> torch.Tensor:
    """Soft overlong punishment, added to the reward.

    0                                  if L <= max_len - buffer
    ((max_len - buffer) - L) / buffer  inside the buffer (0 .. -1)
    -1                                 beyond max_len
    """
    lengths = lengths.float()
    start = max_len - buffer
    inside = (start - lengths) / max(buffer, 1)
    return torch.where(lengths <= start, torch.zeros_like(lengths), torch.clamp(inside, min=-1.0))


def dapo_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = RLConfig.clip_low,
    clip_high: float = RLConfig.clip_high,
    n_tokens: float | None = None,
    aggregation: str = "token",
    n_sequences: float | None = None,
    token_weights: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped policy-gradient loss, averaged over TOKENS (not per sequence).

    logprobs, old_logprobs: [B, T] log-prob of each sampled token under the current / the
        sampling policy; mask: [B, T] 1 on policy-written response tokens, 0 on prompt,
        observation (tool output) and padding tokens; advantages: [B], one per sequence.
    n_tokens: the normaliser; pass the token count of the WHOLE batch when a batch is
        split into micro-batches, so long answers weigh per token, not per sequence.
    aggregation: "token" (DAPO) or "sequence" (GRPO: each sample's mean over its own tokens,
        then the mean over samples; `n_sequences` is then the normaliser, default B). Only
        the ablation in notebook 07 uses "sequence".
    token_weights: [B, T] per-token importance weights, no gradient through them: truncated
        importance sampling when rollouts came from another policy (rl/int8_rollouts.py).
    ref_logprobs, kl_coef: [B, T] log-probs under the reference (SFT) policy; kl_coef *
        `kl_to_reference` is added per token before the aggregation, so it is averaged exactly
        like the policy-gradient term.
    """
    if aggregation not in ("token", "sequence"):
        raise ValueError(f"aggregation must be 'token' or 'sequence', got {aggregation!r}")
    mask = mask.float()
    ratio = torch.exp(logprobs - old_logprobs)  # [B, T]
    adv = advantages.unsqueeze(1)  # [B, 1]
    unclipped = -adv * ratio  # [B, T]
    clipped = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)  # [B, T] clip-higher: asymmetric
    per_token = torch.maximum(unclipped, clipped)  # [B, T] pessimistic bound
    if token_weights is not None:  # samples drawn by another policy: reweighted, not differentiated
        per_token = per_token * token_weights.detach()
    kl = kl_to_reference(logprobs, ref_logprobs) if ref_logprobs is not None else None
    if kl is not None and kl_coef:
        per_token = per_token + kl_coef * kl
    if aggregation == "token":
        denom = n_tokens if n_tokens is not None else mask.sum().clamp(min=1.0)
        loss = (per_token * mask).sum() / denom
    else:  # every sample weighs the same, whatever its length: a long answer's tokens count less
        per_sequence = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # [B]
        loss = per_sequence.sum() / (n_sequences if n_sequences is not None else per_token.shape[0])
    with torch.no_grad():
        was_clipped = (clipped > unclipped).float()  # the clamp changed this token's gradient
        count = mask.sum().clamp(min=1.0)
        stats = {
            "clip_frac": float((was_clipped * mask).sum() / count),
            "ratio_mean": float((ratio * mask).sum() / count),
            "approx_kl": float((((ratio - 1) - (logprobs - old_logprobs)) * mask).sum() / count),
            # tokens whose gradient clip-higher keeps and a symmetric clip would cut: positive
            # advantage, ratio in (1 + clip_low, 1 + clip_high] (above it both cut; notebook 07:
            # how often clip-higher matters)
            "high_ratio_frac": float((((ratio > 1 + clip_low) & (ratio <= 1 + clip_high) & (adv > 0)).float()
                                      * mask).sum() / count),
        }
        if kl is not None:  # how far the policy has moved from the reference, per policy token
            stats["kl_ref"] = float((kl * mask).sum() / count)
    return loss, stats


def tis_weights(train_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor,
                cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance sampling: min(pi_train(a) / pi_sampler(a), cap) per token, as
    exp(min(log pi_train - log pi_sampler, log cap)), no gradient. Where mask is 0 (a token the
    policy did not sample: prompt, observation, padding, or a rollout without sampler log-probs)
    the weight is 1. Returns (weights, capped): capped marks the masked tokens whose ratio
    exceeded the cap. Inputs [B, T]."""
    on = mask.bool()
    log_w = torch.where(on, train_logprobs.detach().float() - sampler_logprobs.float(),
                        torch.zeros_like(sampler_logprobs, dtype=torch.float32))
    log_cap = math.log(cap)
    return torch.exp(log_w.clamp(max=log_cap)), on & (log_w > log_cap)


def kl_to_reference(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """GRPO's per-token KL estimate (Schulman's k3) of the policy from the reference, on tokens
    the policy sampled: exp(r) - r - 1 with r = log pi_ref - log pi. Never negative, 0 where the
    two agree, and its gradient pulls log pi towards log pi_ref. [B, T] -> [B, T]."""
    r = ref_logprobs.detach() - logprobs
    return torch.exp(r) - r - 1


def probability_gap(train_logprobs: torch.Tensor, sample_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """|p_train(a) - p_sampler(a)| of every masked token: [n masked]. Its mean is verl's
    `rollout_probs_diff_mean`. The trainer's probability of each sampled token, before any update,
    must equal the probability the sampler drew it with (same weights, same temperature): below
    ~0.005 is arithmetic noise; a temperature or precision mismatch shows up as 0.01 and more.
    Inputs [B, T]."""
    return (train_logprobs.float().exp() - sample_logprobs.float().exp()).abs()[mask.bool()]
