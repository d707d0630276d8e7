"""Stage 1, capture: a small multi-agent system (the teacher) solves tasks, and every agent
activation is recorded.

Agents, each with its own system prompt and its own context (prompts.py):
    planner  -> a plan
    thinker  -> what the next step must find (the orchestrator's reasoning)
    searcher / coder -> a tool call, which the orchestrator executes
    reflector -> whether the result helps
    answerer -> the final answer

Runs advance in lockstep, one agent at a time across all tasks, so each agent's turn is one
batched generate call. The backend is anything with `.chat(conversations, max_new_tokens)`:
the local HF model, vLLM, or an OpenAI-compatible server.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from coa_lab import prompts
from coa_lab.config import CaptureConfig

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


def _results(run: TeacherRun) -> str:
    obs = [f"[{a.tool}] {a.tool_input}\n-> {a.observation}" for a in run.activations if a.tool]
    return "\n".join(obs) if obs else "(none yet)"


def _context(run: TeacherRun, plan: str | None = None) -> str:
    text = f"Question: {run.question}\n"
    if plan:
        text += f"Plan: {plan}\n"
    return text + f"Results so far:\n{_results(run)}"


def run_teacher(backend, tasks: list, tools, cfg: CaptureConfig, observation_chars: int = 600) -> list[TeacherRun]:
    """Run the multi-agent teacher on `tasks`; returns one fully recorded run per task."""
    runs = [TeacherRun(t.id, t.question, t.profile, list(t.answers)) for t in tasks]
    plans: dict[str, str] = {}

    def step(agent: str, system: str, users: list[str]) -> list[Activation]:
        convs = [[{"role": "system", "content": system}, {"role": "user", "content": u}] for u in users]
        gens = backend.chat(convs, cfg.teacher_max_new_tokens)
        return [Activation(agent, c, g.text, g.prompt_tokens, g.completion_tokens) for c, g in zip(convs, gens)]

    def record(agent_of, system_of, user_of, after=None) -> None:
        # One batched generate call per distinct system prompt (coder vs searcher differ).
        groups: dict[str, list[int]] = {}
        for i, r in enumerate(runs):
            groups.setdefault(system_of(r), []).append(i)
        for system, idx in groups.items():
            acts = step(agent_of(runs[idx[0]]), system, [user_of(runs[i]) for i in idx])
            for i, act in zip(idx, acts):
                if after is not None:
                    after(runs[i], act)
                runs[i].activations.append(act)

    def execute(run: TeacherRun, act: Activation) -> None:
        act.tool = "code" if run.profile in ("math", "code") else "wiki_search"
        act.tool_input = extract_tool_input(run.profile, act.output)
        obs = tools.get(act.tool)(act.tool_input)  # tools never raise: failures are observations
        act.observation, act.tool_ok = obs.text[:observation_chars], obs.ok

    is_code = lambda r: r.profile in ("math", "code")  # noqa: E731
    record(lambda r: "planner", lambda r: prompts.PLANNER, lambda r: f"Task: {r.question}")
    for r in runs:
        plans[r.task_id] = r.activations[-1].output
    for _hop in range(cfg.max_hops):
        record(lambda r: "thinker", lambda r: prompts.THINKER, lambda r: _context(r, plans[r.task_id]))
        record(
            lambda r: "coder" if is_code(r) else "searcher",
            lambda r: prompts.CODER if is_code(r) else prompts.SEARCHER,
            lambda r: f"{_context(r, plans[r.task_id])}\nNext step: {r.activations[-1].output}",
            after=execute,
        )
        record(lambda r: "reflector", lambda r: prompts.REFLECTOR, _context)
    record(lambda r: "thinker", lambda r: prompts.THINKER,
           lambda r: _context(r, plans[r.task_id]) + "\nWhat is the answer?")
    record(lambda r: "answerer", lambda r: prompts.ANSWERER, _context)
    for r in runs:
        r.final_answer = r.activations[-1].output.strip()
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
                raise ValueError(f"{path}:{n}: not a teacher run record ({exc})") from exc
    return runs
