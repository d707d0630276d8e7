"""What each stage generated, so the report can give its rollouts/s and tokens/s beside the matmul probe.

Every student rollout, in RL (screening and training), the control and evaluation, goes through
`student_rollout.run_coa`, which adds its rollouts and the policy tokens they hold (observations are the
tools', not generated) to this process's counter. A stage takes `mark()` before its work and
`since(mark)` after; under several processes each rank counts its own share and `since` adds the
ranks' counts for a stage every rank runs (RL: every rank must call it). The teacher's capture counts its
agents' completion tokens from the runs it recorded (pipeline.capture)."""

from __future__ import annotations

from coa_lab import distributed

_GENERATED = {"rollouts": 0, "tokens": 0}


def count(rollouts: int, tokens: int) -> None:
    """Add `rollouts` finished rollouts holding `tokens` generated (policy) tokens."""
    _GENERATED["rollouts"] += rollouts
    _GENERATED["tokens"] += tokens


def mark() -> dict:
    """This process's counts now: pass it to `since` when the stage is done."""
    return dict(_GENERATED)


def since(start: dict, seconds: float | None = None, across_ranks: bool = True) -> dict:
    """Rollouts and tokens generated since `start`, with their rates over `seconds`; `across_ranks`: summed over
    the ranks of a stage every rank runs (RL), else this process's own (evaluation runs whole in each)."""
    rollouts, tokens = (_GENERATED[k] - start[k] for k in ("rollouts", "tokens"))
    if across_ranks and distributed.world_size() > 1:
        rollouts, tokens = (int(x) for x in distributed.all_reduce_sum([float(rollouts), float(tokens)]))
    return rates({"rollouts": rollouts, "tokens": tokens}, seconds)


def rates(generated: dict, seconds: float | None) -> dict:
    """`generated` with rollouts_per_s and tokens_per_s over `seconds` (none without a positive time)."""
    out = dict(generated)
    if seconds and seconds > 0:
        out["rollouts_per_s"] = round(generated["rollouts"] / seconds, 3)
        out["tokens_per_s"] = round(generated["tokens"] / seconds, 1)
    return out
