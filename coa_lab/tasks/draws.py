"""Which tasks a stage takes from a split: the one seeded order every stage and check shares.

Capture takes the front of each benchmark's train order, RL's pool the tasks after it (`skip`), the
multi-hop share the far end (`from_end`); evaluation takes the front of test and val. No torch here,
so `coa-lab plan` checks a preset's draws (coa_lab/recipe_check.py) anywhere.
"""

from __future__ import annotations

import random

from coa_lab.tasks.suites import load_suite


def draw_tasks(preset, mix: dict[str, int], split: str, skip: dict[str, int] | None = None,
               from_end: bool = False) -> list:
    """Tasks for a mix {"suite/benchmark": n} from a split, each benchmark in a seeded order;
    `skip` = the same kind of mix, tasks already used by an earlier stage (capture before RL);
    `from_end`: from the far end of that order (the capture's multi-hop share)."""
    out = []
    for key, n in mix.items():
        suite, _, benchmark = key.partition("/")
        tasks = load_suite(suite, split, benchmark=benchmark or None)
        random.Random(preset.seed).shuffle(tasks)
        if from_end:
            tasks.reverse()
        offset = (skip or {}).get(key, 0)
        out.extend(tasks[offset : offset + n])
    return out


def by_benchmark(tasks: list, mix: dict[str, int]) -> dict[str, list]:
    """Group tasks drawn with `draw_tasks(mix)` back into their "suite/benchmark" keys."""
    out, i = {}, 0
    for key, n in mix.items():
        out[key] = tasks[i : i + n]
        i += len(out[key])
    return out
