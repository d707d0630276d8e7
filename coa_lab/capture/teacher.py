"""Stage 1, capture: a small multi-agent system (the teacher) solves tasks, and every agent
activation is recorded.

Agents, each with its own system prompt and its own context (prompts.py):
    planner  -> a plan
    thinker  -> what the next step must find (the orchestrator's reasoning)
    searcher / coder -> a tool call, which the orchestrator executes
    reflector -> whether the result helps
    answerer -> the final answer

Each agent is prompted with its instruction plus the two most similar hand-written worked
runs as earlier chat turns (capture/worked_examples.py): the multi-agent system's prompt
engineering, which the distilled single model no longer needs. Runs advance in lockstep,
one agent at a time across the tasks given, so each agent's turn is one batched generate
call. The backend is anything with `.chat(conversations, max_new_tokens)`: the local HF
model, vLLM, or an OpenAI-compatible server (coa_lab/generation/openai_backend.py). Durable, resumable,
concurrent capture over many tasks is capture/recorder.py, which calls `run_teacher` on
lockstep batches (a local model) or on one task at a time side by side (a server).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from coa_lab import prompts
from coa_lab.capture.worked_examples import WorkedRun, nearest
from coa_lab.config import CaptureConfig
from coa_lab.generation.openai_backend import AuthError, BackendError

_FENCE_RE = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", re.S)


@dataclass
class Activation:
    agent: str
    messages: list[dict]
    output: str
    prompt_tokens: int
    completion_tokens: int
    tool: str | None = None
    tool_input: str | None = None
    observation: str | None = None
    tool_ok: bool | None = None


@dataclass
class TeacherRun:
    task_id: str
    question: str
    profile: str
    answers: list[str]
    activations: list[Activation] = field(default_factory=list)
    final_answer: str = ""
    error: str | None = None  # the backend failed for good mid-run (activations so far kept)
    hops: int | None = None  # the tool hops it was run with (capture.max_hops); None: recorded before it was kept

    @property
    def tokens(self) -> int:
        """Every token the MAS paid for: each agent re-reads its whole context."""
        return sum(a.prompt_tokens + a.completion_tokens for a in self.activations)

    @property
    def tool_calls(self) -> int:
        return sum(1 for a in self.activations if a.tool)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TeacherRun":
        acts = [Activation(**a) for a in d.pop("activations")]
        return cls(**d, activations=acts)


def extract_tool_input(profile: str, output: str) -> str:
    """The call a tool agent meant: a fenced program for code, the first line for search."""
    if profile in ("math", "code"):
        m = _FENCE_RE.search(output)
        code = (m.group(1) if m else output).strip()
        return f"```python\n{code}\n```"
    line = next((ln for ln in output.splitlines() if ln.strip()), "")
    line = re.sub(r"</?\s*wiki_search\s*>", "", line)  # an agent echoing the tag means the query inside
    return line.strip().strip('"').removeprefix("Query:").removeprefix("query:").strip()


def first_line(text: str) -> str:
    """What the orchestrator passes on from a prose agent: its first non-empty line (a small
    model often keeps talking after it has said what was asked)."""
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def _results(run: TeacherRun) -> str:
    obs = [a.observation or "" for a in run.activations if a.tool]
    return "\n".join(obs) if obs else "(none yet)"


# What each agent is shown (a user turn) and what it should reply (an assistant turn). The
# same builders render the worked examples and the real task, so the examples look exactly
# like the job.
def _planner_turn(q: str, ex: WorkedRun | None = None, **_) -> tuple[str, str]:
    return f"Task: {q}", ex.plan if ex else ""


def _thinker_turn(q: str, ex: WorkedRun | None = None, plan: str = "", results: str = "", **_) -> tuple[str, str]:
    if ex:
        plan, results = ex.plan, ""
    known = f"\nResults so far: {results}" if results else ""
    return f"Question: {q}\nPlan: {plan}{known}", ex.step if ex else ""


def _tool_turn(q: str, ex: WorkedRun | None = None, step: str = "", code: bool = True, **_) -> tuple[str, str]:
    reply = (f"```python\n{ex.call}\n```" if code else ex.call) if ex else ""
    return f"Question: {q}\nNext step: {ex.step if ex else step}", reply


def _reflector_turn(q: str, ex: WorkedRun | None = None, results: str = "", **_) -> tuple[str, str]:
    return f"Question: {q}\nResult: {ex.observation if ex else results}", ex.reflection if ex else ""


def _conclude_turn(q: str, ex: WorkedRun | None = None, results: str = "", **_) -> tuple[str, str]:
    return f"Question: {q}\nResult: {ex.observation if ex else results}\nWhat is the answer?", ex.conclusion if ex else ""


def _answerer_turn(q: str, ex: WorkedRun | None = None, results: str = "", conclusion: str = "", **_) -> tuple[str, str]:
    if ex:
        results, conclusion = ex.observation, ex.conclusion
    return f"Question: {q}\nResult: {results}\nOrchestrator: {conclusion}", ex.answer if ex else ""


def agent_messages(system: str, turn, question: str, examples: list[WorkedRun], **context) -> list[dict]:
    """An agent's whole prompt: its instruction, worked examples as earlier turns, the task."""
    msgs = [{"role": "system", "content": system}]
    for ex in examples:
        user, reply = turn(ex.question, ex, **context)
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    msgs.append({"role": "user", "content": turn(question, None, **context)[0]})
    return msgs


def run_teacher(backend, tasks: list, tools, cfg: CaptureConfig, observation_chars: int = 600) -> list[TeacherRun]:
    """Run the multi-agent teacher on `tasks`; returns one fully recorded run per task.

    planner -> (thinker -> coder/searcher -> tool -> reflector) x max_hops -> thinker -> answerer.
    Each agent call is one batched `backend.chat` over every run (lockstep); each agent gets
    its own instruction, the orchestrator's context, and `cfg.few_shot` worked examples.
    """
    runs = [TeacherRun(t.id, t.question, t.profile, list(t.answers), hops=cfg.max_hops) for t in tasks]
    examples = {r.task_id: nearest(r.profile, r.question, cfg.few_shot) for r in runs}
    is_code = lambda r: r.profile in ("math", "code")  # noqa: E731
    said: dict[str, dict[str, str]] = {r.task_id: {} for r in runs}  # what each agent last said, per run

    def record(agent_of, system_of, turn, context_of, after=None) -> None:
        convs = [agent_messages(system_of(r), turn, r.question, examples[r.task_id], **context_of(r)) for r in runs]
        gens = backend.chat(convs, cfg.teacher_max_new_tokens)
        for r, conv, g in zip(runs, convs, gens):
            act = Activation(agent_of(r), conv, g.text, g.prompt_tokens, g.completion_tokens)
            if after is not None:
                after(r, act)
            said[r.task_id][act.agent] = first_line(g.text)
            r.activations.append(act)

    def execute(run: TeacherRun, act: Activation) -> None:
        act.tool = "code" if is_code(run) else "wiki_search"
        act.tool_input = extract_tool_input(run.profile, act.output)
        obs = tools.get(act.tool)(act.tool_input)  # tools never raise: failures are observations
        act.observation, act.tool_ok = obs.text[:observation_chars], obs.ok

    try:
        record(lambda r: "planner", lambda r: prompts.PLANNER, _planner_turn, lambda r: {})
        for hop in range(cfg.max_hops):
            record(lambda r: "thinker", lambda r: prompts.THINKER, _thinker_turn,
                   lambda r: {"plan": said[r.task_id]["planner"], "results": _results(r) if hop else ""})
            record(lambda r: "coder" if is_code(r) else "searcher",
                   lambda r: prompts.CODER if is_code(r) else prompts.SEARCHER, _tool_turn,
                   lambda r: {"step": said[r.task_id]["thinker"], "code": is_code(r)}, after=execute)
            record(lambda r: "reflector", lambda r: prompts.REFLECTOR, _reflector_turn,
                   lambda r: {"results": _results(r)})
        record(lambda r: "thinker", lambda r: prompts.THINKER, _conclude_turn, lambda r: {"results": _results(r)})
        record(lambda r: "answerer", lambda r: prompts.ANSWERER, _answerer_turn,
               lambda r: {"results": _results(r), "conclusion": said[r.task_id]["thinker"]})
    except AuthError:
        raise  # every later call would fail the same way: stop the capture
    except BackendError as exc:  # a remote teacher failed for good: a recorded failed run
        for r in runs:
            r.error = str(exc)
        return runs
    for r in runs:
        r.final_answer = first_line(r.activations[-1].output)
    return runs


def save_runs(runs: list[TeacherRun], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in runs:
            f.write(json.dumps(r.to_dict()) + "\n")


def load_runs(path: Path) -> list[TeacherRun]:
    runs = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                runs.append(TeacherRun.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError, KeyError) as exc:
                raise ValueError(f"{path}:{n}: not a teacher run record ({exc}); if a capture was cut off "
                                 "while writing it, run the capture again on this run folder to resume") from exc
    return runs
