"""What the teacher can put in the SFT set, per kind of question.

RL's gain on the test split is capped by what SFT leaves between "never solved" (a group of all-0
rewards: no signal) and "always solved" (no room). SFT learns only the kinds of question the
teacher's kept runs show. So, per kind (a look-up relation, an arithmetic level), this measures
on TRAINING questions how often the teacher solves it greedily (what the capture keeps today) and
in any of `--attempts` tries, the later ones sampled at `--temperature` (what rejection sampling
in the capture would add), and, given `--sft-adapter`, how often the SFT student solves the same
kind on VALIDATION questions (greedy):

    python -m benchmarks.probe_teacher_reach [--per-relation 10] [--level4 16]
        [--attempts 4] [--temperature 0.7] [--sft-adapter runs/demo/sft/adapter]

Writes runs/bench/teacher_reach.json (COA_LAB_PUBLISH=1: docs/results/teacher_reach.json).
Level-4 arithmetic (coa_lab.tasks.arithmetic, four operations and a distractor; never shipped)
is generated on demand. About 12 minutes on 2 cores at the defaults.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import defaultdict
from pathlib import Path


from benchmarks.results import save  # noqa: E402

from coa_lab import pipeline  # noqa: E402
from coa_lab.machine import machine_peak  # noqa: E402
from coa_lab.capture.recorder import make_teacher  # noqa: E402
from coa_lab.capture.teacher import run_teacher  # noqa: E402
from coa_lab.config import get_preset  # noqa: E402
from coa_lab.rl.pool import template_of  # noqa: E402
from coa_lab.tasks import arithmetic  # noqa: E402
from coa_lab.tasks.scorers import score  # noqa: E402
from coa_lab.tasks.suites import load_suite  # noqa: E402

# the relations the SFT set lacks or barely has (docs/history.md, "Look-ups RL cannot reach")
RELATIONS = ("father", "mother", "spouse", "country of citizenship", "date of death", "director", "place of birth")


class Sampled:
    """The teacher backend, every agent call sampled at a temperature (a retry's attempt)."""

    def __init__(self, backend, temperature: float):
        self.backend, self.temperature = backend, temperature

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def chat(self, conversations, max_new_tokens):
        return self.backend.chat(conversations, max_new_tokens, temperature=self.temperature)


def kind_of(task) -> str:
    return "arith:level4" if task.metadata.get("level") == 4 else template_of(task)


def by_relation(tasks: list, per: int, seed: int) -> list:
    tasks = list(tasks)
    random.Random(seed).shuffle(tasks)
    out, have = [], defaultdict(int)
    for t in tasks:
        k = t.metadata.get("relation")
        if k in RELATIONS and have[k] < per:
            out.append(t)
            have[k] += 1
    return out


def teacher_reach(preset, tasks: list, attempts: int, temperature: float) -> dict[str, str]:
    """task id -> the attempt that solved it ("0" greedy, "1".. sampled) or "never"."""
    backend, tools = make_teacher(preset), pipeline.make_tools(preset)
    solved: dict[str, str] = {}
    todo = list(tasks)
    for attempt in range(attempts):
        if not todo:
            break
        runs = run_teacher(backend if attempt == 0 else Sampled(backend, temperature), todo, tools, preset.capture,
                           preset.gen.observation_chars)
        left = []
        for task, run in zip(todo, runs):
            if score(task, run.final_answer) >= 1.0:
                solved[task.id] = str(attempt)
            else:
                left.append(task)
        todo = left
        print(f"attempt {attempt}: {len(solved)} of {len(tasks)} solved", flush=True)
    return {t.id: solved.get(t.id, "never") for t in tasks}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-relation", type=int, default=10, help="training look-ups per relation")
    ap.add_argument("--level4", type=int, default=16, help="level-4 arithmetic questions (training)")
    ap.add_argument("--attempts", type=int, default=4, help="tries per question: greedy, then sampled")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--sft-adapter", type=Path, default=None, help="also score this student on validation")
    ap.add_argument("--student-per-kind", type=int, default=16, help="validation questions per kind")
    ap.add_argument("--name", default="teacher_reach")
    args = ap.parse_args()
    preset = get_preset("cpu-tiny")
    t0 = time.time()
    train = (by_relation(load_suite("mhqa", "train", benchmark="lookup"), args.per_relation, preset.seed)
             + arithmetic.generate("train", args.level4, levels=arithmetic.HARD_LEVELS))
    reach = teacher_reach(preset, train, args.attempts, args.temperature)
    kinds: dict[str, dict] = {}
    for t in train:
        row = kinds.setdefault(kind_of(t), {"teacher_tasks": 0, "teacher_greedy": 0, "teacher_any_attempt": 0})
        row["teacher_tasks"] += 1
        row["teacher_greedy"] += reach[t.id] == "0"
        row["teacher_any_attempt"] += reach[t.id] != "never"
    out = {"preset": preset.name, "attempts": args.attempts, "temperature": args.temperature,
           "teacher_seconds": round(time.time() - t0, 1), "machine": machine_peak(preset)}
    if args.sft_adapter is not None:
        from coa_lab.evaluate import evaluate
        from coa_lab.generation.llm import make_generator

        val = (by_relation(load_suite("mhqa", "val", benchmark="lookup"), args.student_per_kind, preset.seed)
               + arithmetic.generate("val", args.student_per_kind, levels=arithmetic.HARD_LEVELS))
        result = evaluate(make_generator(preset, args.sft_adapter), {"probe": val}, pipeline.make_tools(preset), preset,
                          label="sft")
        reward = {r.task_id: r.reward for r in result.records}
        for task in val:
            row = kinds.setdefault(kind_of(task), {})
            row["student_tasks"] = row.get("student_tasks", 0) + 1
            row["student_solved"] = row.get("student_solved", 0) + int(reward[task.id] >= 1.0)
        out["sft_adapter"] = str(args.sft_adapter)
    out["kinds"] = dict(sorted(kinds.items()))
    out["seconds"] = round(time.time() - t0, 1)
    for k, row in out["kinds"].items():
        print(k, row)
    save(args.name, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
