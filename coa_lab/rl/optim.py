"""RL's optimizer side: AdamW with a learning-rate schedule, and the step-size
measures the metrics row logs beside it (gradient norms of the two loss terms, how far the
weights moved, and the two scales that movement is read against). docs/design.md, "RL: the
optimizer".

The schedule is transformers' (`get_scheduler`), over every optimizer step of the run
(rl.steps x rl.mini_batches): a linear warm-up over rl.warmup_steps steps (step 0 at rate 0, as
transformers does), then rl.lr_schedule to the end. The defaults (constant, no warm-up) multiply
the rate by exactly 1.0 at every step: today's updates, bit for bit.
"""

from __future__ import annotations

import math

import torch

SCHEDULES = {"constant": "constant_with_warmup", "cosine": "cosine", "linear": "linear"}  # ours -> transformers'


def check_schedule(rl) -> None:
    """Refuse a schedule that cannot run, with the fix."""
    if rl.lr_schedule not in SCHEDULES:
        raise ValueError(f"rl.lr_schedule must be one of {sorted(SCHEDULES)}, got {rl.lr_schedule!r}")
    if rl.warmup_steps < 0:
        raise ValueError(f"rl.warmup_steps must be >= 0 (0: no warm-up), got {rl.warmup_steps}")


def total_optimizer_steps(rl) -> int:
    """The optimizer steps of a whole run, the schedule's length: rl.steps x rl.mini_batches (a step
    with fewer kept groups than mini-batches takes fewer, so the schedule may end above its floor)."""
    return max(1, rl.steps * max(1, rl.mini_batches))


def build_optimizer(params, rl):
    """(AdamW at rl.learning_rate, its LambdaLR schedule). The scheduler steps once per optimizer step
    (rl/update._step), and its state goes into the RL checkpoint beside the optimizer's."""
    # late: transformers costs seconds, and the pipeline imports RL's trainer (and so this) for every stage
    from transformers import get_scheduler

    check_schedule(rl)
    optimizer = torch.optim.AdamW(params, lr=rl.learning_rate, weight_decay=0.0)
    scheduler = get_scheduler(SCHEDULES[rl.lr_schedule], optimizer, num_warmup_steps=rl.warmup_steps,
                              num_training_steps=total_optimizer_steps(rl))
    return optimizer, scheduler


def restore_schedule(scheduler, state: dict, rl) -> None:
    """Put the schedule of a resumed run where the checkpoint (`state`, from state.pt) left it, so
    it continues exactly; a checkpoint written before schedules existed ran the constant rate."""
    saved = state.get("scheduler")
    if saved is not None:
        scheduler.load_state_dict(saved)
    elif rl.warmup_steps or rl.lr_schedule != "constant":
        raise ValueError("the checkpoint was written without a learning-rate schedule; resume with the settings "
                         "the run started with (rl.warmup_steps=0, rl.lr_schedule=constant)")


def lr_scales(scheduler) -> dict[str, float]:
    """Σ lr over the optimizer steps taken so far (`lr_x_n`: how far a consistent gradient drifts
    the weights, lr·N at a constant rate) and sqrt(Σ lr²) (`lr_x_sqrt_n`: how far uncorrelated
    steps random-walk them, lr·√N at a constant rate). Read from the scheduler's own multiplier,
    so a resumed run (whose scheduler state is restored) continues both sums exactly."""
    n = scheduler.last_epoch  # scheduler.step() calls so far = optimizer steps taken
    base, factor = scheduler.base_lrs[0], scheduler.lr_lambdas[0]
    rates = [base * factor(k) for k in range(n)]
    return {"lr": rates[-1] if rates else 0.0,  # the rate of the last step taken
            "lr_x_n": sum(rates), "lr_x_sqrt_n": math.sqrt(sum(r * r for r in rates))}


def grad_norm(grads) -> float:
    """The L2 norm over a list of gradient tensors (None: no gradient, counts 0)."""
    norms = [torch.linalg.vector_norm(g.detach().float()) for g in grads if g is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


class StartWeights:
    """The trainable tensors at the start of the run, to measure ‖θ_now − θ_start‖ (`delta_norm`).
    A copy of a LoRA adapter; it goes into the RL checkpoint, so a resumed run measures from the
    same start (a checkpoint written before it existed: from the resume point)."""

    def __init__(self, model, saved: dict | None = None):
        self.params = {name: p for name, p in model.named_parameters() if p.requires_grad}
        src = saved if saved is not None and set(saved) >= set(self.params) else None
        self.weights = {name: (src[name].to(p.device, p.dtype) if src is not None else p.detach().clone())
                        for name, p in self.params.items()}

    def state(self) -> dict:
        return {name: w.detach().cpu() for name, w in self.weights.items()}

    def delta_norm(self) -> float:
        return grad_norm([p.detach() - self.weights[name] for name, p in self.params.items()])
