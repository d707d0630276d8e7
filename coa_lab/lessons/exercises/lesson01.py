"""Lesson 01's exercises: where the team's tokens go, and what a resumed capture keeps."""

from __future__ import annotations

import tempfile
from pathlib import Path

from coa_lab.capture.recorder import read_traces
from coa_lab.lessons.exercises.registry import Exercise, close, register


def _context_by_agent(run) -> dict[str, int]:
    out: dict[str, int] = {}
    for act in run.activations:  # an agent activated twice (the thinker) re-reads twice
        out[act.agent] = out.get(act.agent, 0) + act.prompt_tokens
    return out


def _most_context(run) -> str:
    per_agent = _context_by_agent(run)
    return max(per_agent, key=per_agent.get)


register(Exercise(
    id="01.most_context",
    question="In the one teacher run (`run`), which agent re-read the most context: the most prompt tokens, summed "
             "over all its activations?",
    truth=_most_context,
    hint="each activation has an agent and its prompt_tokens; add them up per agent (the thinker is called "
         "twice), then take the largest.",
    # another agent (the check sees only the right name, not the run)
    wrong=lambda right: "answerer" if right != "answerer" else "planner",
))


def _reread_share(runs) -> float:
    paid = sum(r.tokens for r in runs)
    return sum(a.prompt_tokens for r in runs for a in r.activations) / max(1, paid)


register(Exercise(
    id="01.reread_share",
    question="Over the whole capture (`result.runs`), what fraction of all the tokens the team paid were re-read "
             "context (prompt tokens) rather than tokens an agent wrote?",
    truth=_reread_share,
    hint="run.tokens is every activation's prompt_tokens + completion_tokens; sum the prompt tokens over every "
         "activation of every run and divide by the sum of run.tokens.",
    wrong=lambda right: right * 0.9,
    same=lambda a, b: close(float(a), float(b)),
))


def _resume_after_cut(data: bytes, tasks) -> list[int]:
    with tempfile.TemporaryDirectory() as tmp:  # the capture's own reader on the cut file, not a copy of its rules
        path = Path(tmp) / "traces.jsonl"
        path.write_bytes(data[: len(data) // 2])
        found, _torn = read_traces(path)
    kept = [r for r in found if r.error is None]  # as capture_runs: failed runs are retried too
    have = {r.task_id for r in kept}
    return [len(kept), len({t.id for t in tasks} - have)]


register(Exercise(
    id="01.resume",
    question="Had the crash cut the traces file at half its length (data[: len(data) // 2]), how many runs would "
             "the resumed capture keep, and how many tasks would it capture again? Answer [kept, captured].",
    truth=_resume_after_cut,
    hint="every complete run is one line ending in a newline; the last line without one is the torn write, "
         "dropped. Every task without a kept run is captured again.",
    wrong=lambda right: [right[0] + 1, right[1] - 1],
))
