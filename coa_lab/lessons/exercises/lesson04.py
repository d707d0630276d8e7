"""Lesson 04's exercises: the clip window in probabilities, GRPO against Dr. GRPO advantages, overlong
shaping, what a symmetric clip would cut in the hand update, the run's kept groups."""

from __future__ import annotations

from coa_lab.config import RLConfig
from coa_lab.lessons.exercises.registry import Exercise, close, register
from coa_lab.rl import dapo

OLD_P = 0.40  # the clip exercise's token: the probability the sampling policy gave it


def _has_gradient(ratios, advantage: float, clip_low: float, clip_high: float) -> list[bool]:
    """Per ratio, whether the library's DAPO loss gives that token a gradient (its own backward, not the rule)."""
    import torch

    logp = torch.log(torch.as_tensor(ratios, dtype=torch.float64)).requires_grad_()
    n = logp.numel()
    loss, _ = dapo.dapo_token_loss(logp.unsqueeze(0), torch.zeros(1, n, dtype=torch.float64),
                                   torch.tensor([advantage], dtype=torch.float64), torch.ones(1, n), clip_low, clip_high)
    loss.backward()
    return [bool(g != 0) for g in logp.grad]


def _clip_window(old_p: float = OLD_P, clip_low: float = RLConfig.clip_low, clip_high: float = RLConfig.clip_high) -> tuple[float, float]:
    """(the largest new probability at which a rewarded token still gets gradient, the smallest at which a
    punished one does), found on a grid of new probabilities through the loss's own gradient."""
    grid = [i / 10_000 for i in range(1, 10_000)]
    up = _has_gradient([p / old_p for p in grid], +1.0, clip_low, clip_high)
    down = _has_gradient([p / old_p for p in grid], -1.0, clip_low, clip_high)
    return max(p for p, g in zip(grid, up) if g), min(p for p, g in zip(grid, down) if g)


def _within(tol: float):
    def same(a, b) -> bool:
        return len(a) == len(b) and all(abs(float(x) - float(y)) <= tol for x, y in zip(a, b))
    return same


register(Exercise(
    id="04.clip",
    question=f"The sampling policy gave a token probability {OLD_P}. After an update, up to what probability does "
             "it still get gradient if its advantage is positive, and down to what probability if it is negative, "
             "under the recipe's clip (clip_low, clip_high)? Answer (highest, lowest), 3 decimals.",
    truth=_clip_window,
    hint="the ratio is p_new / p_old. A positive advantage pushes it up, and the clamp stops the gradient once it "
         "passes 1 + clip_high; a negative one pushes it down, stopped below 1 - clip_low. On the other side the "
         "pessimistic max keeps the unclipped term.",
    wrong=lambda right: (OLD_P * (1 + RLConfig.clip_low), right[1]),  # PPO's symmetric bound: clip-higher missed
    same=_within(1.5e-3),
))


def _advantages_of(successes: int = 2, group: int = 8) -> dict[str, tuple[float, float]]:
    """{mode: (a right sample's advantage, a wrong one's)} for a group with `successes` right of `group`."""
    import torch

    rewards = torch.tensor([[1.0] * successes + [0.0] * (group - successes)])
    out = {}
    for mode in ("grpo", "dr_grpo"):
        adv = dapo.advantages(rewards, mode)[0].tolist()
        out[mode] = (adv[0], adv[-1])
    return out


register(Exercise(
    id="04.advantages",
    question="A group of 8 samples has 2 right answers. What advantage does a right sample and a wrong sample get "
             "under GRPO (standardised) and under the recipe's Dr. GRPO? Answer {\"grpo\": (right, wrong), "
             "\"dr_grpo\": (right, wrong)}, 3 decimals.",
    truth=_advantages_of,
    hint="Dr. GRPO: reward minus the group's mean. GRPO divides that by the group's standard deviation, the "
         "population one (unbiased=False).",
    wrong=lambda right: {"grpo": right["dr_grpo"], "dr_grpo": right["grpo"]},
    same=lambda a, b: a.keys() == b.keys() and all(_within(1e-3)(a[k], b[k]) for k in b),
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


def _symmetric_grad_tokens(loss_mask, adv, ratio, clip_low: float) -> list[int]:
    """Per rollout, the tokens that get gradient at these ratios under a symmetric clip (clip_high = clip_low):
    the library's loss, differentiated, at log-ratio `log(ratio)` against an old policy of 0."""
    import torch

    logp = torch.log(ratio.detach().double().cpu()).requires_grad_()
    mask = torch.as_tensor(loss_mask).cpu().float()
    adv = torch.as_tensor(adv).detach().double().cpu()
    loss, _ = dapo.dapo_token_loss(logp, torch.zeros_like(logp), adv, mask, clip_low, clip_low)
    loss.backward()
    return (logp.grad != 0).sum(dim=1).tolist()


register(Exercise(
    id="04.grad_tokens",
    question="In the last of the K optimizer steps of the clip cell (`ratio`, after K - 1 steps), how many tokens "
             "of each rollout would get gradient under PPO's symmetric clip (clip_high = clip_low), where the "
             "recipe's clip-higher keeps more? Count them from `loss_mask`, `adv` and `ratio` without a backward "
             "pass. Answer one count per rollout.",
    truth=_symmetric_grad_tokens,
    hint="a token gets gradient when it is in the loss mask, its rollout's advantage is not 0, and the clamp did "
         "not cut it: a positive advantage loses it above 1 + clip_low here, a negative one below 1 - clip_low "
         "(on the other side the pessimistic max keeps the unclipped term).",
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
