"""Stage 2b, progressive filtering: four successive filters with a survival report.

1. correctness  - the final answer scores 1 with the task's own scorer (the RL reward).
2. complexity   - enough tool hops to teach tool use, and not a runaway (bounded range).
3. quality      - no grammar violations for the profile, no repeated identical tool call,
                  not over the SFT length budget.
4. reflection   - self-corrections must be credible: after a <reflection>, the next tool
                  call must differ from the one before it. (The paper uses a judge model;
                  a rule is the CPU-scale stand-in, and `judge` lets a real model score too.)

The paper expects ~10-20% of raw teacher runs to survive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from coa_lab import protocol
from coa_lab.tasks.scorers import score
from coa_lab.trajectories import TrajectoryRecord

STAGES = ("correctness", "complexity", "quality", "reflection")


@dataclass
class FilterReport:
    """Survivors after each stage, overall and per source ("teacher", "fireact", ...)."""

    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # source -> stage -> n
    dropped: list[dict] = field(default_factory=list)  # id, source, stage, reason

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


def reflection_credible(traj: protocol.Trajectory) -> str | None:
    """None if every reflection is followed by a changed action, else the reason."""
    last_call = None
    after_reflection = False
    for s in traj.blocks:
        if s.kind == "tool":
            call = (s.tag, s.content.strip())
            if after_reflection and call == last_call:
                return "reflection followed by the same tool call"
            last_call, after_reflection = call, False
        elif s.tag == "reflection":
            after_reflection = True
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
             else f"{rec.n_tool_calls} tool calls, want {min_tool_calls}..{max_tool_calls}"),
            ("quality", lambda: _quality(rec, traj, max_tokens)),
            ("reflection", lambda: reflection_credible(traj) or (None if judge is None or judge(rec) else "judge rejected")),
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
        return f"{rec.n_tokens} tokens > {max_tokens}"
    return None
