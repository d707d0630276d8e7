"""Lesson 02's exercises: reading the funnel, the budget that halves it, and re-running its filters at
another budget."""

from __future__ import annotations

from coa_lab.distill.filters import progressive_filter
from coa_lab.lessons.exercises.registry import Exercise, register


def _bump_first(right: dict) -> dict:
    out = dict(right)
    first = next(iter(out))
    out[first] += 1
    return out


register(Exercise(
    id="02.correctness_drops",
    question="In the funnel of every source (`report`), how many trajectories did the correctness filter drop, all "
             "sources together?",
    truth=lambda counts: sum(c["input"] - c["correctness"] for c in counts.values()),
    hint="report.counts[source] holds how many entered (input) and how many survived each stage; a drop at "
         "correctness is input minus correctness.",
    wrong=lambda right: right + 1,
))


def _n_tokens(tok, text: str) -> int:
    return len(tok(text, add_special_tokens=False)["input_ids"])  # as the lesson's filter counts them


def _half_budget(kept, tok) -> int:
    """The largest budget at which the length rule keeps at most half (rounded down) of `kept`."""
    lengths = sorted(_n_tokens(tok, r.text) for r in kept)
    if not lengths:
        return 0
    return lengths[len(lengths) // 2] - 1  # one token short of the first trajectory that must go


register(Exercise(
    id="02.half_budget",
    question="To keep at most half of the trajectories the funnel keeps now (half rounded down), what is the "
             "largest max_trajectory_tokens you could set?",
    truth=_half_budget,
    hint="lowering the budget only changes the quality stage's length rule: a kept trajectory stays kept while "
         "its token count (r.n_tokens) is at most the budget. Sort the kept trajectories by length.",
    wrong=lambda right: right + 1,
))


def _kept_by_source(records, tasks_by_id, tok, preset, max_tokens: int) -> dict[str, int]:
    _, report = progressive_filter(records, tasks_by_id, lambda t: _n_tokens(tok, t), preset.distill.min_tool_calls,
                                   preset.distill.max_tool_calls, max_tokens)
    return {source: c["reflection"] for source, c in report.counts.items()}


def _lost_at_budget(records, tasks_by_id, tok, preset, budget: int = 200) -> dict[str, int]:
    before = _kept_by_source(records, tasks_by_id, tok, preset, preset.distill.max_trajectory_tokens)
    after = _kept_by_source(records, tasks_by_id, tok, preset, budget)
    return {source: before[source] - after[source] for source in before}


def _same_losses(a: dict, b: dict) -> bool:
    """Equal, a source left out counting as one that lost nothing."""
    return {k: v for k, v in a.items() if v} == {k: v for k, v in b.items() if v}


register(Exercise(
    id="02.tighter",
    question="Tighten the quality filter to max_trajectory_tokens=200 and run the funnel again on the same records. "
             "How many fewer trajectories does each source keep? Answer {source: how many fewer}.",
    truth=_lost_at_budget,
    hint="call progressive_filter twice (the preset's budget, then 200) and compare the last stage's count "
         "(reflection) per source; sources whose trajectories are long lose the most.",
    wrong=_bump_first,
    same=_same_losses,
))
