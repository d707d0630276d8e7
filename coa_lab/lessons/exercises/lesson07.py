"""Lesson 07's exercises: what masking takes out of training, which tokens clip-higher changes, and
whether the masking ablation's format-validity gap is larger than its paired error."""

from __future__ import annotations

from pathlib import Path

from coa_lab.comparison import paired
from coa_lab.config import RLConfig
from coa_lab.lessons.exercises.registry import Exercise, register
from coa_lab.rl import dapo
from coa_lab.training.sft import IGNORE_INDEX
from coa_lab.trajectories import load_records


def _trained(labels) -> int:
    return sum(label != IGNORE_INDEX for label in labels)


def _observation_share(on, off) -> float:
    return (_trained(off["labels"]) - _trained(on["labels"])) / _trained(off["labels"])


register(Exercise(
    id="07.observation_share",
    question="On the lesson's example trajectory, what share of the tokens the UNMASKED student trains on are "
             "tokens the masked student does not train on (tool output)?",
    truth=lambda on, off: _observation_share(on, off),
    hint="count the labels that are not IGNORE_INDEX in off[\"labels\"] and in on[\"labels\"]; the difference "
         "over the unmasked count.",
    # the same difference over the MASKED count: the wrong denominator
    wrong=lambda share: share / (1 - share),
    same=lambda a, b: abs(float(a) - float(b)) <= 1e-3,
))

# one sample with a positive advantage, one with a negative: a ratio on each side of every bound
TOY_RATIOS = ((0.85, 1.10, 1.21, 1.25, 1.35), (0.75, 0.90, 1.10, 1.25, 1.30))
TOY_ADVANTAGES = (1.0, -1.0)


def _keeps_gradient(ratios, advantages, clip_low: float, clip_high: float) -> list[bool]:
    import torch

    logp = torch.log(torch.tensor(ratios)).requires_grad_()
    loss, _ = dapo.dapo_token_loss(logp, torch.zeros_like(logp), torch.tensor(advantages), torch.ones_like(logp),
                                   clip_low, clip_high)
    loss.backward()
    return (logp.grad != 0).flatten().tolist()


def _clip_band(ratios=TOY_RATIOS, advantages=TOY_ADVANTAGES, clip_low: float | None = None,
               clip_high: float | None = None) -> float:
    # the recipe's bounds unless the lesson passes its preset's
    clip_low = RLConfig.clip_low if clip_low is None else clip_low
    clip_high = RLConfig.clip_high if clip_high is None else clip_high
    # measured from the loss's own gradients, not from the rule: the arm with clip-higher against the symmetric one
    higher = _keeps_gradient(ratios, advantages, clip_low, clip_high)
    symmetric = _keeps_gradient(ratios, advantages, clip_low, clip_low)
    return sum(h and not s for h, s in zip(higher, symmetric)) / len(higher)


register(Exercise(
    id="07.clip_band",
    question="In the toy batch (two samples, advantages +1 and -1, five token ratios each), what share of the ten "
             "tokens keep a gradient with clip-higher that the symmetric clip (clip_high = clip_low) cuts?",
    truth=_clip_band,
    hint="only a positive advantage is clipped from above, and only a ratio in (1 + clip_low, 1 + clip_high] is "
         "inside one range and outside the other; above 1 + clip_high both clips cut it.",
    wrong=lambda right: right + 0.1,  # here: also counting the ratio above 1 + clip_high
    same=lambda a, b: abs(float(a) - float(b)) <= 1e-6,
))


def _validity(path) -> dict[str, float]:
    return {r.task_id: float(bool(r.metadata.get("valid"))) for r in load_records(path)}


def _validity_gain(run) -> tuple[float, float]:
    # masking_ablation saves each arm's evaluation as <arm>/eval/<arm>_trajectories.jsonl
    by_arm = {arm: _validity(Path(run) / "masking" / arm / "eval" / f"{arm}_trajectories.jsonl")
              for arm in ("masked", "unmasked")}
    p = paired(by_arm["unmasked"], by_arm["masked"])
    return p["gain"], p["se"]


register(Exercise(
    id="07.validity_paired",
    question="Run 1's format validity, masked minus unmasked, task by task on the same held-out tasks: the gain "
             "and its paired standard error. Answer (gain, se). Is the gap more than twice its error?",
    truth=_validity_gain,
    hint="each arm's records are in RUN/masking/<arm>/eval/<arm>_trajectories.jsonl (load_records); per task "
         "1.0 if metadata[\"valid\"] else 0.0; then coa_lab.comparison.paired(unmasked, masked).",
    wrong=lambda right: (right[0], right[1] + 0.05),  # right gap, wrong error: the check reads both
    same=lambda a, b: len(a) == len(b) and all(abs(float(x) - float(y)) <= 1e-3 for x, y in zip(a, b)),
))
