"""Stage 5, evaluation: run the single CoA model on held-out tasks and score it with the SAME
scorer RL rewards with.

Metrics per suite: accuracy (avg@k; pass@1 when k = 1), unbiased pass@k, answered rate,
format validity (protocol.validate), tokens and tool calls per success, and the cost of the
multi-agent teacher vs the single model on the same tasks.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from math import comb
from pathlib import Path

from coa_lab import protocol
from coa_lab.config import Preset
from coa_lab.generation.llm import make_generator
from coa_lab.paths import DATASETS_DIR
from coa_lab.student_rollout import run_coa
from coa_lab.tasks.file_checks import task_files
from coa_lab.tasks.loaders import load_tasks
from coa_lab.tasks.records import Task
from coa_lab.tasks.scorers import score
from coa_lab.tools.registry import build_tools
from coa_lab.trajectories import TrajectoryRecord, save_records


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k) for n samples, c correct."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 < k <= n and 0 <= c <= n, got n={n} c={c} k={k}")
    if n - c < k:  # every draw of k samples contains a correct one
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


@dataclass
class SuiteResult:
    suite: str
    tasks: int
    samples: int
    accuracy: float  # mean score over all samples (avg@k)
    pass_at_k: float
    answered: float  # fraction of samples with a closed <answer>
    format_valid: float  # fraction with no grammar violation
    tokens_per_sample: float  # prompt + response tokens (one KV-cached context)
    tokens_per_success: float | None
    tool_calls_per_success: float | None
    tool_calls_per_sample: float


@dataclass
class EvalResult:
    label: str
    suites: dict[str, SuiteResult] = field(default_factory=dict)
    records: list[TrajectoryRecord] = field(default_factory=list)

    def summary(self) -> dict:
        return {name: asdict(s) for name, s in self.suites.items()}


@dataclass(frozen=True)
class Readout:
    """One reading of a system: tasks by suite, sampled `samples` times each at `temperature`."""

    tasks_by_suite: dict[str, list]
    samples: int = 1
    temperature: float = 0.0


def greedy_temperature(preset: Preset, k: int) -> float:
    """The temperature of a plain readout at k samples: eval.temperature, raised to 0.6 for k > 1."""
    return preset.eval.temperature if k == 1 else max(preset.eval.temperature, 0.6)


def evaluate(generator, tasks_by_suite: dict[str, list], tools, preset: Preset, label: str = "model",
             samples: int | None = None, temperature: float | None = None) -> EvalResult:
    """`temperature`: the sampling temperature as given (the arms readout samples at RL's own,
    rl.temperature); None: eval.temperature, raised to 0.6 for k > 1 samples."""
    k = samples or preset.eval.samples
    if temperature is None:
        temperature = greedy_temperature(preset, k)
    return evaluate_readouts(generator, {label: Readout(tasks_by_suite, k, temperature)}, tools, preset)[label]


def evaluate_readouts(generator, readouts: dict[str, Readout], tools, preset: Preset) -> dict[str, EvalResult]:
    """Every readout of one system (greedy on test and validation, k samples on the headline
    tasks) in ONE rollout pass over their union, each row at its readout's temperature: a decode
    step costs nearly as much at 4 rows as at 36 (it reads every weight either way), and a task's
    greedy and sampled rows share one prompt, which the decoder prefills once for all of them
    (docs/results.md, "Speed"). Returns an EvalResult per readout label."""
    tasks, samples, temperature, spans = [], [], [], []
    for label, readout in readouts.items():
        every = [t for ts in readout.tasks_by_suite.values() for t in ts]
        spans.append((label, readout, sum(samples), len(every) * readout.samples))
        tasks += every
        samples += [readout.samples] * len(every)
        temperature += [readout.temperature] * len(every)
    labels = ", ".join(readouts)
    all_rollouts = run_coa(generator, tasks, tools, preset.gen, samples=samples, temperature=temperature,
                           progress=f"eval {labels}")
    return {label: _scored(label, readout, all_rollouts[start : start + n])
            for label, readout, start, n in spans}


def _scored(label: str, readout: Readout, all_rollouts: list) -> EvalResult:
    """A readout's rollouts (suite after suite, each task's samples together) scored per suite."""
    result, k = EvalResult(label), readout.samples
    offset = 0
    for suite, tasks in readout.tasks_by_suite.items():
        rollouts = all_rollouts[offset : offset + k * len(tasks)]
        offset += k * len(tasks)
        scores, valid, answered, tokens, calls = [], [], [], [], []
        for r in rollouts:
            answer = protocol.final_answer(r.text)
            s = score(r.task, answer)
            scores.append(s)
            answered.append(answer is not None)
            valid.append(not protocol.validate(r.text, r.task.profile))
            tokens.append(len(r.prompt_ids) + len(r.response_ids))
            calls.append(r.tool_calls)
            result.records.append(TrajectoryRecord(
                id=f"{label}-{r.task.id}-{len(result.records)}", task_id=r.task.id, source=f"eval:{label}",
                profile=r.task.profile, question=r.task.question, answers=list(r.task.answers), text=r.text,
                reward=s, n_tokens=len(r.response_ids), n_tool_calls=r.tool_calls,
                metadata={"finish": r.finish, "valid": valid[-1], "predicted": answer, "suite": suite},
            ))
        result.suites[suite] = _suite_result(suite, len(tasks), k, scores, answered, valid, tokens, calls)
    return result


def _suite_result(suite: str, n_tasks: int, k: int, scores, answered, valid, tokens, calls) -> SuiteResult:
    wins = [i for i, s in enumerate(scores) if s == 1.0]
    per_task = [scores[i * k : (i + 1) * k] for i in range(n_tasks)]
    n = max(1, len(scores))
    return SuiteResult(
        suite=suite, tasks=n_tasks, samples=k,
        accuracy=sum(scores) / n,
        pass_at_k=sum(pass_at_k(k, sum(1 for x in t if x == 1.0), k) for t in per_task) / max(1, len(per_task)),
        answered=sum(answered) / n,
        format_valid=sum(valid) / n,
        tokens_per_sample=sum(tokens) / n,
        tokens_per_success=(sum(tokens[i] for i in wins) / len(wins)) if wins else None,
        tool_calls_per_success=(sum(calls[i] for i in wins) / len(wins)) if wins else None,
        tool_calls_per_sample=sum(calls) / n,
    )


def save_eval(result: EvalResult, out_dir: str | Path) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{result.label}.json").write_text(json.dumps(result.summary(), indent=2))
    save_records(result.records, out_dir / f"{result.label}_trajectories.jsonl")


def teacher_cost(runs) -> dict:
    """Tokens the multi-agent teacher spent per task: every agent re-reads its own context."""
    if not runs:
        return {"runs": 0}
    return {
        "runs": len(runs),
        "tokens_per_task": sum(r.tokens for r in runs) / len(runs),
        "agent_calls_per_task": sum(len(r.activations) for r in runs) / len(runs),
        "tool_calls_per_task": sum(r.tool_calls for r in runs) / len(runs),
    }


def teacher_score(run) -> float:
    """The teacher run's final answer graded by the task's own scorer (as the student is)."""
    task = Task(run.task_id, run.question, list(run.answers), "teacher", run.profile, {})
    return score(task, run.final_answer.strip() or None)


def teacher_eval(runs, key_of: dict[str, str] | None = None) -> dict:
    """Accuracy and cost of the multi-agent teacher, overall ("all") and per benchmark key:
    tokens, agent calls and tool calls per task and per success."""
    groups: dict[str, list] = {"all": list(runs)}
    for r in runs:
        if key_of and r.task_id in key_of:
            groups.setdefault(key_of[r.task_id], []).append(r)
    out = {}
    for key, rs in groups.items():
        wins = [r for r in rs if teacher_score(r) == 1.0]
        out[key] = {
            **teacher_cost(rs),
            "accuracy": len(wins) / len(rs) if rs else 0.0,
            "tokens_per_success": sum(r.tokens for r in wins) / len(wins) if wins else None,
            "agent_calls_per_success": sum(len(r.activations) for r in wins) / len(wins) if wins else None,
            "tool_calls_per_success": sum(r.tool_calls for r in wins) / len(wins) if wins else None,
        }
    return out


def evaluate_target(preset: Preset, target: str, adapter: str | Path | None = None, limit: int | None = None,
                    samples: int | None = None) -> EvalResult:
    """`coa-lab eval --model M --adapter DIR --suite FILE_OR_SUITE`: any model (or adapter) on
    any task file the loaders read, a folder of them, a suite or a "suite/benchmark"."""
    groups: dict[str, list] = {}
    for path in task_files(target):
        tasks = load_tasks(path)
        random.Random(preset.seed).shuffle(tasks)  # a limit takes a fair sample, not the file's head
        key = str(path.relative_to(DATASETS_DIR)) if path.is_relative_to(DATASETS_DIR) else str(path)
        groups[key] = tasks[:limit] if limit else tasks
    profiles = {t.profile for ts in groups.values() for t in ts}
    tools = build_tools(sorted({tool for p in profiles for tool in protocol.PROFILE_TOOLS[p]}))
    return evaluate(make_generator(preset, adapter), groups, tools, preset, label="model", samples=samples)
