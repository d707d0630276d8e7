"""Lesson 04's exercises: clip-higher, advantages, overlong shaping, the hand update, the run."""

from __future__ import annotations

from coa_lab.lessons.exercises.registry import Exercise, close, register
from coa_lab.rl import dapo

TOY_RATIOS = (0.79, 0.81, 1.19, 1.21, 1.25, 1.29)  # the clip-higher cell's: one on each side of every bound


def _gradients(clip_high: float, ratios=TOY_RATIOS, advantage: float = 1.0) -> list[bool]:
    import torch

    logp = torch.log(torch.tensor(ratios)).requires_grad_()
    n = len(ratios)
    loss, _ = dapo.dapo_token_loss(logp.unsqueeze(0), torch.zeros(1, n), torch.tensor([advantage]),
                                   torch.ones(1, n), 0.2, clip_high)
    loss.backward()
    return [bool(g != 0) for g in logp.grad]


def _flip_last(right: dict) -> dict:
    out = {k: list(v) for k, v in right.items()}
    first = next(iter(out))
    out[first][-1] = not out[first][-1]
    return out


register(Exercise(
    id="04.clip",
    question="With a positive advantage, which of the six toy ratios keep a gradient at clip_high 0.3, and which at "
             "0.1? Answer {0.3: [six bools], 0.1: [six bools]}.",
    truth=lambda ratios=TOY_RATIOS: {h: _gradients(h, ratios) for h in (0.3, 0.1)},
    hint="a positive advantage pushes the ratio up; the clamp stops the gradient once the ratio is above "
         "1 + clip_high, and never below 1 (the pessimistic max picks the unclipped term there).",
    wrong=_flip_last,
))


def _advantages(rewards) -> list[float]:
    import torch

    return dapo.group_advantages(torch.tensor([list(map(float, rewards))]))[0].tolist()


register(Exercise(
    id="04.advantages",
    question="A group of four samples is rewarded [1, 0, 0, 0]. What are the four advantages (3 decimals will do)?",
    truth=lambda rewards=(1, 0, 0, 0): _advantages(rewards),
    hint="(reward - the group's mean) / the group's standard deviation, the population one (unbiased=False).",
    wrong=lambda right: [-x for x in right],
    same=lambda a, b: len(a) == len(b) and all(abs(x - y) < 1e-3 for x, y in zip(a, b)),
))


def _half_penalty_length(max_len: int, buffer: int) -> int:
    import torch

    lengths = torch.arange(max_len + 1)
    return int(lengths[dapo.overlong_penalty(lengths, max_len, buffer) <= -0.5][0])


register(Exercise(
    id="04.overlong",
    question="With max_len 448 and buffer 64, at what length (policy tokens) does the soft overlong penalty first "
             "reach -0.5?",
    truth=lambda max_len=448, buffer=64: _half_penalty_length(max_len, buffer),
    hint="the penalty is 0 up to max_len - buffer, then falls linearly to -1 at max_len.",
    wrong=lambda right: right + 1,
))


def _grad_tokens(loss_mask, adv, ratio, clip_low: float, clip_high: float) -> list[int]:
    """Per rollout, the tokens whose loss still has a gradient: in the mask, an advantage that is not 0,
    and a ratio the clamp has not cut in the direction the advantage pushes it."""
    import torch

    adv = torch.as_tensor(adv).to(ratio.device).unsqueeze(1)  # [G, 1]
    cut = ((adv > 0) & (ratio > 1 + clip_high)) | ((adv < 0) & (ratio < 1 - clip_low))  # [G, T]
    return (loss_mask.bool() & (adv != 0) & ~cut).sum(dim=1).tolist()  # [G]


register(Exercise(
    id="04.grad_tokens",
    question="In the last of the K mini-batches of the update by hand (`ratio`, after K - 1 steps), how many tokens "
             "of each rollout still get gradient? Count them from `loss_mask`, `adv` and `ratio` alone, without a "
             "backward pass. Answer one count per rollout.",
    truth=_grad_tokens,
    hint="a token gets gradient when it is in the loss mask, its rollout's advantage is not 0, and the clamp did "
         "not cut it: a positive advantage loses it above 1 + clip_high, a negative one below 1 - clip_low (on "
         "the other side the pessimistic max keeps the unclipped term).",
    wrong=lambda right: [right[0] + 1, *right[1:]],
))


register(Exercise(
    id="04.kept",
    question="Over the lesson's run, what fraction of the sampled groups did dynamic sampling keep (all steps "
             "together)?",
    truth=lambda metrics: sum(x["kept_groups"] for x in metrics) / max(1, sum(x["sampled_groups"] for x in metrics)),
    hint="result.metrics has kept_groups and sampled_groups per step; sum each over the steps, then divide.",
    wrong=lambda right: right + 0.1,
    same=lambda a, b: close(float(a), float(b)),
))
