"""Stage 2b, progressive filtering: four successive filters with a survival report.

1. correctness  - the final answer scores 1 with the task's own scorer (the RL reward).
2. complexity   - enough tool hops to teach tool use, and not a runaway (bounded range).
3. quality      - no grammar violations for the profile, no repeated identical tool call,
                  not over the SFT length budget.
4. reflection   - self-corrections must be credible (reflection_credible): a reflection
                  reports what its tool returned, the call after it differs from the one
                  before, and the answer rests on what that corrected call returned. (The
                  paper uses a judge model; rules are the CPU-scale stand-in, and `judge`
                  lets a real model score too.)

The paper expects ~10-20% of raw teacher runs to survive.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from coa_lab import protocol
from coa_lab.tasks.scorers import last_boxed, normalize_answer, score
from coa_lab.trajectories import TrajectoryRecord

STAGES = ("correctness", "complexity", "quality", "reflection")

# Every drop's reason starts with one of these (per stage), so a funnel can count why:
# `FilterReport.by_reason()`.
REASON_KINDS = {
    "correctness": ("wrong answer",),
    "complexity": ("too few tool calls", "too many tool calls"),
    "quality": ("format", "repeated identical tool call", "over the token budget"),
    "reflection": ("same tool call after a reflection", "reflection misreports the tool",
                   "answer ignores the correction", "judge rejected"),
}


@dataclass
class FilterReport:
    """Survivors after each stage, overall and per source ("teacher", "fireact", ...)."""

    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # source -> stage -> n
    dropped: list[dict] = field(default_factory=list)  # id, source, stage, reason

    def by_reason(self) -> dict[str, dict[str, int]]:
        """stage -> reason kind -> records dropped there (every stage listed, 0s included)."""
        out = {stage: dict.fromkeys(kinds, 0) for stage, kinds in REASON_KINDS.items()}
        for d in self.dropped:
            kind = next(k for k in REASON_KINDS[d["stage"]] if d["reason"].startswith(k))
            out[d["stage"]][kind] += 1
        return out

    def table(self) -> str:
        lines = ["| source | input | " + " | ".join(STAGES) + " |", "|---|---" + "|---" * len(STAGES) + "|"]
        for source, c in sorted(self.counts.items()):
            lines.append(f"| {source} | {c['input']} | " + " | ".join(str(c[s]) for s in STAGES) + " |")
        return "\n".join(lines)


def _redundant_call(traj: protocol.Trajectory) -> bool:
    """A tool call identical to an earlier one, NOT right after a reflection. (A repeat right
    after a reflection is a fake self-correction: stage 4 judges those.)"""
    seen, after_reflection = set(), False
    for s in traj.blocks:
        if s.kind == "tool":
            key = (s.tag, s.content.strip())
            if key in seen and not after_reflection:
                return True
            seen.add(key)
            after_reflection = False
        elif s.tag == "reflection":
            after_reflection = True
    return False


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _numbers(text: str) -> set[str]:
    return set(_NUMBER.findall(text.replace(",", "")))


def _mentions(text: str, answer: str) -> bool:
    """Whether `answer` appears in `text` as whole words, both normalized as the scorers do."""
    a = normalize_answer(answer)
    return bool(a) and f" {a} " in f" {normalize_answer(text)} "


def reflection_credible(traj: protocol.Trajectory, question: str = "") -> str | None:
    """None if every self-correction is credible, else the reason. Three ways one is not:
    - the call after a reflection repeats the call before it (nothing was corrected);
    - a reflection reports a number that neither its observation nor the question holds (it
      describes a result the tool did not return: "printed 2905" after 130754);
    - the run calls a tool again after a reflection, then answers with something that call did
      not return (the correction was noise: the answer still rests on the earlier result)."""
    last_call, last_obs, after_reflection, corrected = None, None, False, False
    for s in traj.blocks:
        if s.kind == "tool":
            call = (s.tag, s.content.strip())
            if after_reflection and call == last_call:
                return "same tool call after a reflection"
            corrected = corrected or (after_reflection and last_call is not None)
            last_call, last_obs, after_reflection = call, None, False
        elif s.tag == protocol.OBSERVATION:
            last_obs = s.content
        elif s.tag == "reflection":
            after_reflection = True
            if last_obs is not None:
                invented = sorted(_numbers(s.content) - _numbers(last_obs) - _numbers(question))
                if invented:
                    return f"reflection misreports the tool: it says {invented[0]}, the observation does not"
    answers = [s.content.strip() for s in traj.blocks if s.tag == "answer" and s.closed]
    answer = (last_boxed(answers[-1]) or answers[-1]) if answers else None
    if corrected and last_obs is not None and answer and not _mentions(last_obs, answer):
        return f"answer ignores the correction: {answer!r} is not in what the corrected call returned"
    return None


def progressive_filter(
    records: list[TrajectoryRecord],
    tasks_by_id: dict,
    count_tokens: Callable[[str], int],
    min_tool_calls: int = 1,
    max_tool_calls: int = 8,
    max_tokens: int = 640,
    judge: Callable[[TrajectoryRecord], bool] | None = None,
) -> tuple[list[TrajectoryRecord], FilterReport]:
    report = FilterReport()
    kept = []
    for rec in records:
        c = report.counts.setdefault(rec.source, {"input": 0, **{s: 0 for s in STAGES}})
        c["input"] += 1
        traj = protocol.parse(rec.text)
        task = tasks_by_id[rec.task_id]
        rec.reward = score(task, protocol.final_answer(rec.text))
        rec.n_tool_calls = len(traj.tool_calls())
        rec.n_tokens = count_tokens(rec.text)
        # Lazily evaluated, in order: a (model-backed) judge only sees what reached stage 4.
        checks = (
            ("correctness", lambda: None if rec.reward == 1.0 else f"wrong answer {protocol.final_answer(rec.text)!r}"),
            ("complexity", lambda: None if min_tool_calls <= rec.n_tool_calls <= max_tool_calls
             else f"too {'few' if rec.n_tool_calls < min_tool_calls else 'many'} tool calls: "
                  f"{rec.n_tool_calls}, want {min_tool_calls}..{max_tool_calls}"),
            ("quality", lambda: _quality(rec, traj, max_tokens)),
            ("reflection", lambda: reflection_credible(traj, rec.question)
             or (None if judge is None or judge(rec) else "judge rejected")),
        )
        for stage, check in checks:
            reason = check()
            if reason is not None:
                report.dropped.append({"id": rec.id, "source": rec.source, "stage": stage, "reason": reason})
                break
            c[stage] += 1
        else:
            kept.append(rec)
    return kept, report


def _quality(rec: TrajectoryRecord, traj: protocol.Trajectory, max_tokens: int) -> str | None:
    violations = protocol.validate(traj, rec.profile)
    if violations:
        return f"format: {violations[0]}"
    if _redundant_call(traj):
        return "repeated identical tool call"
    if rec.n_tokens is not None and rec.n_tokens > max_tokens:
        return f"over the token budget: {rec.n_tokens} tokens > {max_tokens}"
    return None
