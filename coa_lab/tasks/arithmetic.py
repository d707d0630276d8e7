"""Generated tool-arithmetic tasks: the numbers are too large to do in the head, so the code
tool carries the weight. A model that answers from memory scores ~0; one that writes the
right one-line Python program scores ~1. Three levels give RL headroom beyond SFT:

    level 1  one operation on multi-digit numbers      "What is 6411 plus 788?"
    level 2  two-step word problems                     a - b + c, a*b - c
    level 3  three-step word problems + a distractor   a*b - c + d, a*b + c*d, with an unused number
    level 4  four-step word problems + a distractor    a - b - c + d*e, a*b + c - d - e (on demand only)

Every task is a plain :class:`Task` (profile ``math``, graded by the same exact numeric
scorer as GSM8K) with ``metadata = {"family": "arith", "level", "expression"}``.

Three splits from one seeded stream of problems:

- ``train``: a problem is train iff a hash of its question text falls outside the held-out
  bucket (1 in ``HELDOUT_BUCKETS``), so train and held-out never share a question.
- ``val``: the first ``VAL_ROWS`` held-out problems; every tuning decision is made here.
- ``test``: the held-out problems after those, minus any whose expression (numbers and
  operators) or name-swapped question (a sticker story with another name) already is a
  train or val problem. Part of it is the selection split, read by RL seed benchmarks
  before two preset choices; the rest is the confirmation split (datasets/heldout_splits.json).

The same seed gives the same files on every machine (`python -m coa_lab.tasks.arithmetic
--write` rebuilds the shipped ``datasets/math/arith/{train,val,test}.jsonl``; a test checks
they are byte-identical).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path

from coa_lab.tasks.records import Task

FAMILY = "arith"
LEVELS = (1, 2, 3)
SPLITS = ("train", "val", "test")
HELDOUT_BUCKETS = 10  # 1 in 10 questions is held out (val, then test); the rest is train
VAL_ROWS = 240  # the first 240 held-out problems are val
SHIPPED_SIZES = {"train": 2400, "val": VAL_ROWS, "test": 480}  # rows per split in datasets/math/arith/

NAMES = ("Mia", "Omar", "Lena", "Ravi", "Sofia", "Jonas", "Aiko", "Tariq", "Nora", "Pablo", "Ines", "Kofi")
_NAME_RE = re.compile(r"\b(?:" + "|".join(NAMES) + r")\b")


def split_of(question: str) -> str:
    """'heldout' for one question in HELDOUT_BUCKETS, decided by its text alone (so never
    both), else 'train'. Held-out questions become val or test (see :func:`generate`)."""
    digest = hashlib.sha256(question.encode()).digest()
    return "heldout" if digest[0] % HELDOUT_BUCKETS == 0 else "train"


def name_free(question: str) -> str:
    """The question with every name replaced: two sticker stories that differ only by the
    buyer's name are the same problem, though their texts (and so their hashes) differ."""
    return _NAME_RE.sub("<name>", question)


def _level1(rng: random.Random) -> tuple[str, str]:
    op = rng.choice(("plus", "minus", "times", "divided by"))
    if op == "plus":
        a, b = rng.randint(1000, 9999), rng.randint(100, 9999)
        return f"What is {a} plus {b}?", f"{a} + {b}"
    if op == "minus":
        a = rng.randint(2000, 9999)
        b = rng.randint(100, a - 100)
        return f"What is {a} minus {b}?", f"{a} - {b}"
    if op == "times":
        a, b = rng.randint(12, 99), rng.randint(101, 999)
        return f"What is {a} times {b}?", f"{a} * {b}"
    b, q = rng.randint(12, 99), rng.randint(21, 999)
    return f"What is {b * q} divided by {b}?", f"{b * q} // {b}"


# Two story templates per level: a 135M student sees ~25 kept trajectories, so every
# template must appear several times for SFT to generalise to new numbers and names.
def _level2(rng: random.Random) -> tuple[str, str]:
    name = rng.choice(NAMES)
    kind = rng.randrange(2)
    if kind == 0:
        a = rng.randint(2000, 9999)
        b, c = rng.randint(100, a - 500), rng.randint(100, 999)
        return (f"A warehouse holds {a} boxes. {b} boxes are shipped out and {c} new boxes arrive. "
                f"How many boxes are in the warehouse now?", f"{a} - {b} + {c}")
    if kind == 1:
        a, b = rng.randint(12, 99), rng.randint(24, 150)
        c = rng.randint(100, a * b - 50)
        return (f"{name} buys {a} packs of {b} stickers and gives away {c} stickers. "
                f"How many stickers does {name} have left?", f"{a} * {b} - {c}")


def _level3(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(2)
    if kind == 0:
        a, b, x = rng.randint(120, 990), rng.randint(4, 9), rng.randint(12, 300)
        c = rng.randint(100, a * b - 100)
        d = rng.randint(100, 999)
        return (f"A farm has {a} hens and {x} cows. Each hen lays {b} eggs a week. This week the farm "
                f"sells {c} eggs and buys {d} eggs. How many eggs does the farm have at the end of the week?",
                f"{a} * {b} - {c} + {d}")
    a, b, c, d, x = (rng.randint(12, 90), rng.randint(12, 48), rng.randint(12, 90), rng.randint(6, 24),
                     rng.randint(200, 900))
    return (f"A school with {x} students orders {a} boxes of {b} pencils and {c} boxes of {d} pens. "
            f"How many pencils and pens does the school order in total?", f"{a} * {b} + {c} * {d}")


def _level4(rng: random.Random) -> tuple[str, str]:
    """Four operations in the order the story tells them, five numbers used and one distractor:
    one step longer than level 3, made to find a level where SFT is not at its ceiling. The 135M
    teacher and its SFT student solve ~none of it (benchmarks/probe_teacher_reach.py); neither did
    a first try, brackets the story implies ("(a + b) * c": 0 of 12 and 0 of 48; docs/design.md)."""
    name = rng.choice(NAMES)
    if rng.randrange(2) == 0:
        a = rng.randint(3000, 9999)
        b, c = rng.randint(100, 999), rng.randint(100, 999)
        d, e, x = rng.randint(4, 30), rng.randint(12, 60), rng.randint(3, 40)
        while x in (d, e):  # the distractor must not be one of the numbers the answer uses
            x = rng.randint(3, 40)
        return (f"A shop has {a} apples and {x} workers. It sells {b} apples in the morning and {c} apples in the "
                f"afternoon, then gets {d} crates of {e} apples. How many apples does the shop have now?",
                f"{a} - {b} - {c} + {d} * {e}")
    a, b, c = rng.randint(120, 600), rng.randint(4, 12), rng.randint(100, 900)
    # what is paid stays below what was saved: a story ends with money left, not a debt
    total = a * b + c
    d = rng.randint(100, min(900, total - 150))
    e, x = rng.randint(50, min(400, total - d - 1)), rng.randint(18, 70)
    while x in (b, e):
        x = rng.randint(18, 70)
    return (f"{name} is {x} years old and saves {a} dollars a month for {b} months, gets a gift of {c} dollars, then "
            f"pays {d} dollars for a trip and {e} dollars for books. How many dollars does {name} have left?",
            f"{a} * {b} + {c} - {d} - {e}")


_LEVEL_FNS = {1: _level1, 2: _level2, 3: _level3, 4: _level4}
# Level 4 is generated on demand only (levels=(4,)), never shipped: neither the 135M teacher
# nor the SFT student solves it (benchmarks/probe_teacher_reach.py), so it has nothing to teach
# at this scale; a stronger teacher (capture.teacher_model / teacher_url) is what would use it.
HARD_LEVELS = (4,)
HARD_NAME = "arith4"


def _problems(part: str, n: int, seed: int, levels: tuple[int, ...], keep_from: int = 0,
              keep=lambda question, expression: True) -> list[tuple[int, str, str]]:
    """The first `n` (level, question, expression) of `part` ("train" or "heldout") in the
    seeded stream, levels cycling 1, 2, 3, 1, ...; from index `keep_from` on, a problem is
    also skipped unless keep(question, expression)."""
    rng = random.Random(f"{FAMILY}-{seed}")  # a str seed: stable across Python versions
    out, seen = [], set()
    while len(out) < n:
        level = levels[len(out) % len(levels)]
        # draw until this level yields a new question of the wanted part
        while True:
            question, expression = _LEVEL_FNS[level](rng)
            if (question not in seen and split_of(question) == part
                    and (len(out) < keep_from or keep(question, expression))):
                break
        seen.add(question)
        out.append((level, question, expression))
    return out


def generate(split: str, n: int, seed: int = 0, levels: tuple[int, ...] = LEVELS) -> list[Task]:
    """The first `n` problems of `split` (train, val, test); same seed, same tasks.

    val has at most VAL_ROWS problems (more would be test's). test skips any problem whose
    expression or name-free question is already one of the shipped train problems (the first
    SHIPPED_SIZES["train"]) or of val, for the same seed and levels.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r} (the old 'eval' rows are now 'val')")
    bad = set(levels) - set(_LEVEL_FNS)
    if bad or not levels:
        raise ValueError(f"levels must be a non-empty subset of {tuple(_LEVEL_FNS)}, got {levels!r}")
    if split == "train":
        problems = _problems("train", n, seed, levels)
    elif split == "val":
        if n > VAL_ROWS:
            raise ValueError(f"val has {VAL_ROWS} problems; the held-out ones after them are test")
        problems = _problems("heldout", n, seed, levels)
    else:
        # test continues the held-out stream after val, so val keeps the first VAL_ROWS problems
        seen = _problems("train", SHIPPED_SIZES["train"], seed, levels) + _problems("heldout", VAL_ROWS, seed, levels)
        expressions = {expression for _, _, expression in seen}
        questions = {name_free(question) for _, question, _ in seen}
        problems = _problems("heldout", VAL_ROWS + n, seed, levels, keep_from=VAL_ROWS,
                             keep=lambda q, e: e not in expressions and name_free(q) not in questions)[VAL_ROWS:]
    tasks = []
    # any level-4 problem gets its own prefix: an "arith-..." id always names a shipped problem
    name = HARD_NAME if set(levels) & set(HARD_LEVELS) else FAMILY
    for i, (level, question, expression) in enumerate(problems):
        answer = eval(expression, {"__builtins__": {}})  # noqa: S307 - our own template, digits and + - * //
        tasks.append(Task(id=f"{name}-{split}-{i}", question=question, answers=[str(answer)],
                          source=FAMILY, profile="math",
                          metadata={"family": FAMILY, "level": level, "expression": expression}))
    return tasks


SUBSETS = {  # SOURCE.json's description of each shipped file
    "train": "the first {n} train problems of coa_lab.tasks.arithmetic.generate(seed={seed}), levels 1-3 cycling",
    "val": "the first {n} held-out problems of coa_lab.tasks.arithmetic.generate(seed={seed}), levels 1-3 cycling "
           "(the old eval set, ids renamed); every tuning decision is made on it",
    "test": "the {n} held-out problems after val in coa_lab.tasks.arithmetic.generate(seed={seed}), levels 1-3 "
            "cycling, skipping any whose expression or name-swapped question is a train or val problem; "
            "made after tuning; part of it was read since to choose RL settings (the selection split), the rest is the unread confirmation split (datasets/heldout_splits.json)",
}


def write_shipped(datasets_dir: Path, seed: int = 0) -> list[Path]:
    """(Re)write datasets/math/arith/{train,val,test}.jsonl and their SOURCE.json;
    byte-identical for the same seed."""
    out, entries = [], []
    for split, n in SHIPPED_SIZES.items():
        path = datasets_dir / "math" / FAMILY / f"{split}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = "".join(json.dumps(t.to_dict(), ensure_ascii=False) + "\n" for t in generate(split, n, seed)).encode()
        path.write_bytes(data)
        out.append(path)
        entries.append({
            "file": path.name, "rows": n, "size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "subset": SUBSETS[split].format(n=n, seed=seed),
            "note": "generated, not copied: python -m coa_lab.tasks.arithmetic --write rebuilds it byte-identically",
            "origins": [{"source_repo": "coa-lab (this repository)", "commit": "coa_lab/tasks/arithmetic.py",
                         "path": "coa_lab/tasks/arithmetic.py", "license": "no third-party data: templates and "
                         "numbers are generated by this project's code"}],
        })
    (datasets_dir / "math" / FAMILY / "SOURCE.json").write_text(json.dumps(entries, indent=1) + "\n", encoding="utf-8")
    return out


if __name__ == "__main__":
    import argparse

    from coa_lab.paths import DATASETS_DIR

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite the shipped files under datasets/math/arith/")
    parser.add_argument("--show", type=int, default=0, help="print N generated train problems")
    args = parser.parse_args()
    if args.write:
        for p in write_shipped(DATASETS_DIR):
            print(p)
    for t in generate("train", args.show):
        print(t.metadata["level"], t.question, "=", t.answers[0])
