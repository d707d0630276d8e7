"""Split the learnable families' test files into the SELECTION split and a fresh CONFIRMATION split,
written once to ``datasets/heldout_splits.json`` (ids only: the rows stay in their test files).

Why: the 192 test tasks the lab has reported on (cpu-tiny's 144 ``math/arith`` + 48 ``mhqa/lookup``,
the first of each test file in ``random.Random(0)`` order, as ``pipeline.draw_tasks`` draws them)
were read by seven RL seed benchmarks, and preset decisions were taken after them: they have been
used for selection. They keep the name ``test`` (alias ``selection``). The confirmation split is
the remainder of the two test files, read only for a final recipe (``--split confirm`` in
benchmarks/bench_rl_seeds.py, each reading appended to docs/results/confirm_readings.jsonl).

Disjointness beyond ids and questions:
- arith: no expression of a confirmation task is the expression of a train, val or selection task.
- lookup: no confirmation task shares a subject or a 2Wiki source row (``metadata.origin_row``) with
  any train, val or selection task. Val and test already share 6 source rows (the 16 tuned-on rows
  moved to val, datasets/build_lookup.py), so test rows from those rows cannot be confirmation;
  they are left out of both (``excluded``).

Not used at run time; rebuilding gives the same file:

    PYTHONPATH=. python datasets/build_heldout_splits.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "heldout_splits.json"
SELECTION = {"math/arith": 144, "mhqa/lookup": 48}  # cpu-tiny's eval.tasks for the two families
SEED = 0  # the presets' seed: draw_tasks' order


def _rows(family: str, split: str) -> list[dict]:
    path = HERE / family / f"{split}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _keys(row: dict, family: str) -> set:
    m = row["metadata"]
    if family == "math/arith":
        return {("expression", m["expression"])}
    return {("subject", m["subject"]), ("origin_row", m["origin_row"])}


def build() -> dict:
    out = {"seed": SEED, "selection_sizes": SELECTION, "families": {}}
    for family, n in SELECTION.items():
        test = _rows(family, "test")
        order = list(test)
        random.Random(SEED).shuffle(order)
        selection, rest = order[:n], order[n:]
        taken = set().union(*(_keys(r, family) for split in ("train", "val") for r in _rows(family, split)),
                            *(_keys(r, family) for r in selection))
        confirm = [r for r in rest if not (_keys(r, family) & taken)]
        excluded = [r for r in rest if _keys(r, family) & taken]
        file_order = {r["id"]: i for i, r in enumerate(test)}  # ids listed in file order: stable diffs
        out["families"][family] = {
            "selection": sorted((r["id"] for r in selection), key=file_order.get),
            "confirm": sorted((r["id"] for r in confirm), key=file_order.get),
            "excluded": sorted((r["id"] for r in excluded), key=file_order.get),
        }
    return out


def main() -> None:
    data = build()
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    for family, d in data["families"].items():
        print(family, {k: len(v) for k, v in d.items()})


if __name__ == "__main__":
    main()
