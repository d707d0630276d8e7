"""The lab's shipped task suites: which files under ``datasets/`` form each suite's splits.

A suite is one agent profile's benchmarks.  ``load_suite(name, split)`` reads the suite's
*default* files for that split; ``benchmark=`` picks one file instead, e.g.
``load_suite("math", "test", benchmark="math500")``.  Splits:

- ``train``: the pools capture, SFT and RL draw from.
- ``val``: where every tuning decision is made; only the learnable families have one.
- ``test``: what is reported. For the learnable families it is the SELECTION split (alias
  ``selection``): the 144 + 48 test tasks the RL seed benchmarks read before any confirmation
  split existed, so settings were chosen after reading them; a claim rests on ``confirm``.
- ``confirm``: the learnable families' CONFIRMATION split, the rest of their test files, read
  only for a final recipe (``datasets/heldout_splits.json``, drawn once by
  ``datasets/build_heldout_splits.py``; disjoint from every other split by id, question,
  arith expression, look-up subject and source row).
- ``eval``: an alias of ``test`` (the same files), kept for older callers.

Why these defaults (also in datasets/README.md):

- ``math`` test = GSM8K-200 + MATH-500 + AIME24 + AMC23: all graded offline by math-verify.
- ``mhqa`` test = HotpotQA-200 + 2Wiki-200: the two whose supporting paragraphs are in the
  shipped ``wiki_search`` corpus, so the default test is answerable offline.  NQ, TriviaQA,
  PopQA, MuSiQue and Bamboogle need open-web (or full-Wikipedia) retrieval; pick them with
  ``benchmark=``.
- ``code`` test = HumanEval + MBPP(test) + APPS(stdin/stdout) + LiveCodeBench v4: all graded
  by running their tests in the sandbox.
- ``web`` test = GAIA (text-only dev) + WebWalkerQA: loads offline, but solving it needs the
  online web tools, and WebWalker's sentence-long answers need the LLM judge to grade.
- train pools: GSM8K train (math), HotpotQA train (mhqa), MBPP train split (code); ``web``
  has none.
- the learnable families, picked with ``benchmark=`` for train and test: ``math/arith``
  (generated tool arithmetic, three levels, :mod:`coa_lab.tasks.arithmetic`) and
  ``mhqa/lookup`` (single-hop look-ups of 2Wiki evidence triples, answerable from the shipped
  corpus); each has train, val and test files, and they are the default ``val`` of their
  suites (``code`` and ``web`` have no val).  Part of each test file is the selection split,
  which RL seed benchmarks read before two preset choices; the rest is the confirmation split,
  read only for a final recipe (datasets/heldout_splits.json).  The CPU demo trains and reports on these;
  GSM8K/HotpotQA stay as the honest hard rows.  Every split is disjoint from every other
  (tests/repo/test_datasets_disjoint.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from coa_lab.paths import DATASETS_DIR
from coa_lab.tasks.loaders import load_tasks
from coa_lab.tasks.records import DatasetError, Task

SPLITS = ("train", "val", "test", "selection", "confirm", "eval")  # "eval" = "selection" = "test"

# suite -> split -> benchmark -> file (relative to datasets/); dict order = load order.
SUITE_FILES: dict[str, dict[str, dict[str, str]]] = {
    "math": {
        "train": {"gsm8k": "math/gsm8k/train.jsonl", "arith": "math/arith/train.jsonl"},
        "val": {"arith": "math/arith/val.jsonl"},
        "test": {"gsm8k": "math/gsm8k/eval.jsonl", "arith": "math/arith/test.jsonl", "math500": "math/math500/eval.jsonl",
                 "aime24": "math/aime24/eval.jsonl", "amc23": "math/amc23/eval.jsonl"},
    },
    "mhqa": {
        "train": {"hotpotqa": "mhqa/hotpotqa/train.jsonl", "lookup": "mhqa/lookup/train.jsonl"},
        "val": {"lookup": "mhqa/lookup/val.jsonl"},
        "test": {"hotpotqa": "mhqa/hotpotqa/eval.jsonl", "lookup": "mhqa/lookup/test.jsonl", "2wiki": "mhqa/2wiki/eval.jsonl",
                 "musique": "mhqa/musique/eval.jsonl", "bamboogle": "mhqa/bamboogle/eval.jsonl",
                 "nq": "mhqa/nq/eval.jsonl", "triviaqa": "mhqa/triviaqa/eval.jsonl",
                 "popqa": "mhqa/popqa/eval.jsonl"},
    },
    "code": {
        "train": {"mbpp": "code/mbpp/train.jsonl"},
        "val": {},
        "test": {"humaneval": "code/humaneval/eval.jsonl", "mbpp": "code/mbpp/eval.jsonl",
                 "apps": "code/apps/eval.jsonl", "livecodebench": "code/livecodebench/livecodebench_v4.parquet"},
    },
    "web": {
        "train": {},
        "val": {},
        "test": {"gaia": "web/gaia/eval.jsonl", "webwalker": "web/webwalker/eval.jsonl"},
    },
}
for _splits in SUITE_FILES.values():
    _splits["eval"] = _splits["selection"] = _splits["test"]  # one dict: an alias cannot drift
    # the learnable families' test files also hold the confirmation split, told apart by id
    _splits["confirm"] = {b: f for b, f in _splits["test"].items() if b in ("arith", "lookup")}

# Which test-file rows are the selection split and which the confirmation split, by id
HELDOUT_SPLITS_FILE = "heldout_splits.json"

# Benchmarks read when no benchmark= is given (see the module doc for why).
DEFAULT_TEST: dict[str, tuple[str, ...]] = {
    "math": ("gsm8k", "math500", "aime24", "amc23"),
    "mhqa": ("hotpotqa", "2wiki"),
    "code": ("humaneval", "mbpp", "apps", "livecodebench"),
    "web": ("gaia", "webwalker"),
}
# Train pools read when no benchmark= is given: the real benchmarks' own train splits.
DEFAULT_TRAIN: dict[str, tuple[str, ...]] = {"math": ("gsm8k",), "mhqa": ("hotpotqa",), "code": ("mbpp",), "web": ()}
# Only the learnable families have a validation split.
DEFAULT_VAL: dict[str, tuple[str, ...]] = {"math": ("arith",), "mhqa": ("lookup",), "code": (), "web": ()}
DEFAULTS = {"train": DEFAULT_TRAIN, "val": DEFAULT_VAL, "test": DEFAULT_TEST, "eval": DEFAULT_TEST,
            "selection": DEFAULT_TEST, "confirm": DEFAULT_VAL}
SUITES = tuple(SUITE_FILES)


def suite_files(name: str, split: str, benchmark: str | None = None) -> list[Path]:
    """The files ``load_suite(name, split, benchmark=benchmark)`` reads, in order."""
    if name not in SUITE_FILES:
        raise ValueError(f"unknown suite {name!r}; choose one of {sorted(SUITE_FILES)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    files = SUITE_FILES[name][split]
    if not files:  # checked first, so benchmark= gets this message too
        if split in ("val", "confirm"):
            what = "validation" if split == "val" else "confirmation"
            raise DatasetError(f"suite {name!r} has no {what} split (only math/arith and mhqa/lookup have one)")
        raise DatasetError(f"suite {name!r} has no {split} split (no shipped training pool)")
    if benchmark is not None:
        if benchmark not in files:
            raise ValueError(f"suite {name!r} has no {split} benchmark {benchmark!r}; choose one of {sorted(files)}")
        return [DATASETS_DIR / files[benchmark]]
    return [DATASETS_DIR / files[b] for b in DEFAULTS[split][name]]


def suite_path(name: str, split: str, benchmark: str | None = None) -> Path:
    """Path of one shipped suite file; ``benchmark`` is needed when the split has several."""
    paths = suite_files(name, split, benchmark)
    if len(paths) != 1:
        raise ValueError(f"suite {name!r} {split} has {len(paths)} files; pass benchmark= "
                         f"(one of {sorted(SUITE_FILES[name][split])})")
    return paths[0]


def load_suite(name: str, split: str, limit: int | None = None, benchmark: str | None = None) -> list[Task]:
    """Shipped tasks of suite ``name`` (math, mhqa, code, web) and ``split`` (train, val,
    test; eval = test).

    Without ``benchmark`` the split's default files are concatenated in a fixed order;
    ``limit`` caps the total.
    """
    tasks: list[Task] = []
    for path in suite_files(name, split, benchmark):
        if limit is not None and len(tasks) >= limit:
            break
        if not path.exists():
            raise DatasetError(f"{path}: shipped suite file missing (rebuild with the scripts in datasets/, "
                               "see datasets/README.md, or set COA_LAB_DATASETS)")
        ids = heldout_ids(path, split)
        where = None if ids is None else (lambda row, ids=ids: row.get("id") in ids)
        tasks += load_tasks(path, limit=None if limit is None else limit - len(tasks), where=where)
    return tasks


def heldout_ids(path: Path, split: str) -> frozenset[str] | None:
    """The ids of a learnable family's test file that form `split` (test/selection/eval: the
    selection split; confirm: the confirmation split), or None for any other file or split."""
    if split == "train" or split == "val":
        return None
    manifest = path.parent.parent.parent / HELDOUT_SPLITS_FILE  # DATASETS_DIR/<suite>/<family>/test.jsonl
    family = f"{path.parent.parent.name}/{path.parent.name}"
    if path.name != "test.jsonl" or family not in ("math/arith", "mhqa/lookup"):
        return None
    if not manifest.exists():
        raise DatasetError(f"{manifest}: missing; it says which {family} test rows are the selection and which "
                           "the confirmation split (rebuild: PYTHONPATH=. python datasets/build_heldout_splits.py)")
    families = json.loads(manifest.read_text())["families"]
    return frozenset(families[family]["confirm" if split == "confirm" else "selection"])
