"""Choosing the RL pool by the policy's own pass rate, as the paper does.

DAPO learns only from groups whose samples disagree (dynamic sampling drops all-right and
all-wrong groups). A question the SFT model always solves, or never does, wastes every
rollout spent on it. So before RL each candidate question is sampled `samples` times by the
SFT policy, and only those it solves *sometimes but not always* -- a pass rate within
[min_pass, max_pass] -- enter the pool. At group size 8, a pass rate between ~0.2 and ~0.8
makes most groups informative (docs/design.md, "RL: the pool and the step").
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from coa_lab.config import Preset
from coa_lab.student_rollout import run_coa_across_ranks
from coa_lab.rl.rollouts import rollout_reward


@dataclass
class PoolReport:
    candidates: int
    samples: int
    kept: int
    pass_rates: dict[str, float] = field(default_factory=dict)  # task id -> pass rate
    histogram: dict[str, int] = field(default_factory=dict)  # "0/4".."4/4" (and "1/2": decided early) -> tasks
    rollouts: int | None = None  # samples drawn in all (adaptive screening draws fewer than candidates x samples)

    def to_dict(self) -> dict:
        return {"candidates": self.candidates, "samples": self.samples, "kept": self.kept, "rollouts": self.rollouts,
                "histogram": self.histogram, "pass_rates": self.pass_rates}


def keep_by_pass_rate(tasks: list, pass_rates: list[float], min_pass: float, max_pass: float) -> list:
    """The tasks whose pass rate lies in [min_pass, max_pass], excluding 0 and 1 always
    (an all-wrong or all-right group carries no learning signal)."""
    if len(tasks) != len(pass_rates):
        raise ValueError(f"{len(tasks)} tasks but {len(pass_rates)} pass rates")
    return [t for t, p in zip(tasks, pass_rates) if kept_rate(p, min_pass, max_pass)]


def kept_rate(p: float, min_pass: float, max_pass: float) -> bool:
    """The pool's rule for one pass rate: within [min_pass, max_pass], and never 0 or 1."""
    return 0.0 < p < 1.0 and min_pass <= p <= max_pass


def decided_early(successes: int, drawn: int, samples: int, min_pass: float, max_pass: float) -> bool:
    """Whether `successes` of the first `drawn` samples already fix a candidate's fate for any
    outcome of the remaining `samples - drawn`: every reachable pass rate is kept by
    keep_by_pass_rate (with min_pass 0.2, max_pass 0.8 and 4 samples, two samples that disagree
    put the rate at 1/4..3/4 whatever follows). A candidate that could still end at 1.0 is never
    decided early: solved every time, it becomes an anchor, so it needs all its samples."""
    if drawn >= samples:
        return True
    reachable = [(successes + extra) / samples for extra in range(samples - drawn + 1)]
    return 1.0 not in reachable and all(kept_rate(p, min_pass, max_pass) for p in reachable)


def select_pool(generator, candidates: list, tools, preset: Preset) -> tuple[list, PoolReport]:
    """Sample every candidate `rl.pool_samples` times with the policy at `rl.temperature` and keep
    the mixed-outcome ones, pass rate in [rl.pool_min_pass, rl.pool_max_pass] (in a launched run
    the ranks share the rollouts and all get the same pool). A pass is RL's own reward
    (rl/rollouts.rollout_reward, gated on the format as rl.format_reward says).

    rl.pool_adaptive: draw half the samples first, and the rest only for candidates those did not
    decide (decided_early). The kept set and the anchors follow the same rule as drawing every
    sample; what is saved is the samples of candidates already shown mixed (~15% of the
    demo's screening rollouts). Their pass rate is reported over the samples drawn, and the
    histogram counts them as "k/drawn"."""
    r, gen_cfg = preset.rl, preset.gen
    samples, min_pass, max_pass, temperature = r.pool_samples, r.pool_min_pass, r.pool_max_pass, r.temperature
    format_gate = r.format_reward
    first = min(samples, max(2, -(-samples // 2))) if r.pool_adaptive else samples
    rollouts = run_coa_across_ranks(generator, candidates, tools, gen_cfg, samples=first, temperature=temperature,
                                    progress="screen pool")
    wins = [sum(rollout_reward(r, format_gate) == 1.0 for r in rollouts[i * first : (i + 1) * first])
            for i in range(len(candidates))]
    drawn = [first] * len(candidates)
    rest = [i for i in range(len(candidates)) if not decided_early(wins[i], first, samples, min_pass, max_pass)]
    if rest and samples > first:
        more = samples - first
        extra = run_coa_across_ranks(generator, [candidates[i] for i in rest], tools, gen_cfg, samples=more,
                                     temperature=temperature, progress="screen pool (rest)")
        for j, i in enumerate(rest):
            wins[i] += sum(rollout_reward(r, format_gate) == 1.0 for r in extra[j * more : (j + 1) * more])
            drawn[i] = samples
    rates = [w / d for w, d in zip(wins, drawn)]
    kept = keep_by_pass_rate(candidates, rates, min_pass, max_pass)
    histogram: dict[str, int] = {f"{k}/{samples}": 0 for k in range(samples + 1)}
    for w, d in zip(wins, drawn):
        histogram[f"{w}/{d}"] = histogram.get(f"{w}/{d}", 0) + 1
    return kept, PoolReport(len(candidates), samples, len(kept), {t.id: p for t, p in zip(candidates, rates)},
                            histogram, rollouts=sum(drawn))


def headroom(screening: dict) -> dict:
    """What RL could add on the screened candidates (a pool.json): the SFT policy's mean pass@1 at
    the sampling temperature, and its pass@k (solved at least once in the samples drawn; with
    adaptive screening k is the samples a candidate got). RL that sharpens the policy can at most
    close the gap between the two on such tasks."""
    rates = list(screening["pass_rates"].values())
    return {"candidates": screening["candidates"], "samples": screening["samples"],
            "rollouts": screening["rollouts"], "kept": screening["kept"], "histogram": screening["histogram"],
            "mean_pass_at_1": round(sum(rates) / len(rates), 4) if rates else None,
            "pass_at_k": round(sum(r > 0 for r in rates) / len(rates), 4) if rates else None}


def template_of(task) -> str:
    """The kind of question a task is, for spreading anchors over kinds: an arithmetic task's
    expression shape ("n * n - n + n" is the farm story), a look-up's relation, else its source."""
    meta = task.metadata or {}
    if meta.get("expression"):
        return f"{meta.get('family', task.source)}:{re.sub(r'[0-9]+', 'n', meta['expression'])}"
    if meta.get("relation"):
        return f"{meta.get('family', task.source)}:{meta['relation']}"
    return task.source


def anchor_stream(anchors: list, seed: int = 0) -> Iterator:
    """Anchors forever, round-robin over their templates (each pass reshuffled), so every kind of
    question the SFT model already solves is re-checked every few steps. Drift seen on the demo
    is template-wide: RL's "Only hens lay eggs" on farm questions became "Only code this way:"
    on warehouse questions the pool never held."""
    if not anchors:
        raise ValueError("anchor_stream needs at least one anchor")
    rng = random.Random(seed)
    by_template: dict[str, list] = {}
    for t in anchors:
        by_template.setdefault(template_of(t), []).append(t)
    while True:
        queues = [rng.sample(ts, len(ts)) for ts in by_template.values()]
        rng.shuffle(queues)
        while any(queues):
            for q in queues:
                if q:
                    yield q.pop()
