"""The lab's shipped task suites: which files under ``datasets/`` form each suite's splits.

A suite is one agent profile's benchmarks.  ``load_suite(name, split)`` reads the suite's
*default* files for that split; ``benchmark=`` picks one file instead, e.g.
``load_suite("math", "eval", benchmark="math500")``.  Why these defaults (also in
datasets/README.md):

- ``math`` eval = GSM8K-200 + MATH-500 + AIME24 + AMC23: all graded offline by math-verify.
- ``mhqa`` eval = HotpotQA-200 + 2Wiki-200: the two whose supporting paragraphs are in the
  shipped ``wiki_search`` corpus, so the default eval is answerable offline.  NQ, TriviaQA,
  PopQA, MuSiQue and Bamboogle need open-web (or full-Wikipedia) retrieval; pick them with
  ``benchmark=``.
- ``code`` eval = HumanEval + MBPP(test) + APPS(stdin/stdout) + LiveCodeBench v4: all graded
  by running their tests in the sandbox.
- ``web`` eval = GAIA (text-only dev) + WebWalkerQA: loads offline, but solving it needs the
  online web tools, and WebWalker's sentence-long answers need the LLM judge to grade.
- train pools: GSM8K train (math), HotpotQA train (mhqa), MBPP train split (code); ``web``
  has none.
- the learnable families, picked with ``benchmark=``: ``math/arith`` (generated tool
  arithmetic, three levels, :mod:`coa_lab.tasks.arithmetic`) and ``mhqa/lookup`` (single-hop
  look-ups of 2Wiki evidence triples, answerable from the shipped corpus); each has its own
  train and eval file. The CPU demo trains and reports on these; GSM8K/HotpotQA stay as the
  honest hard rows.  Every train pool is disjoint from every eval file (tests/test_datasets_disjoint.py).
"""

from __future__ import annotations

from pathlib import Path

from coa_lab.paths import DATASETS_DIR
from coa_lab.tasks.loaders import load_tasks
from coa_lab.tasks.records import DatasetError, Task

SPLITS = ("train", "eval")

# suite -> split -> benchmark -> file (relative to datasets/); dict order = load order.
SUITE_FILES: dict[str, dict[str, dict[str, str]]] = {
    "math": {
        "train": {"gsm8k": "math/gsm8k/train.jsonl", "arith": "math/arith/train.jsonl"},
        "eval": {"gsm8k": "math/gsm8k/eval.jsonl", "arith": "math/arith/eval.jsonl", "math500": "math/math500/eval.jsonl",
                 "aime24": "math/aime24/eval.jsonl", "amc23": "math/amc23/eval.jsonl"},
    },
    "mhqa": {
        "train": {"hotpotqa": "mhqa/hotpotqa/train.jsonl", "lookup": "mhqa/lookup/train.jsonl"},
        "eval": {"hotpotqa": "mhqa/hotpotqa/eval.jsonl", "lookup": "mhqa/lookup/eval.jsonl", "2wiki": "mhqa/2wiki/eval.jsonl",
                 "musique": "mhqa/musique/eval.jsonl", "bamboogle": "mhqa/bamboogle/eval.jsonl",
                 "nq": "mhqa/nq/eval.jsonl", "triviaqa": "mhqa/triviaqa/eval.jsonl",
                 "popqa": "mhqa/popqa/eval.jsonl"},
    },
    "code": {
        "train": {"mbpp": "code/mbpp/train.jsonl"},
        "eval": {"humaneval": "code/humaneval/eval.jsonl", "mbpp": "code/mbpp/eval.jsonl",
                 "apps": "code/apps/eval.jsonl", "livecodebench": "code/livecodebench/livecodebench_v4.parquet"},
    },
    "web": {
        "train": {},
        "eval": {"gaia": "web/gaia/eval.jsonl", "webwalker": "web/webwalker/eval.jsonl"},
    },
}
# Benchmarks read when no benchmark= is given (see the module doc for why).
DEFAULT_EVAL: dict[str, tuple[str, ...]] = {
    "math": ("gsm8k", "math500", "aime24", "amc23"),
    "mhqa": ("hotpotqa", "2wiki"),
    "code": ("humaneval", "mbpp", "apps", "livecodebench"),
    "web": ("gaia", "webwalker"),
}
# Train pools read when no benchmark= is given: the real benchmarks' own train splits.
DEFAULT_TRAIN: dict[str, tuple[str, ...]] = {"math": ("gsm8k",), "mhqa": ("hotpotqa",), "code": ("mbpp",), "web": ()}
SUITES = tuple(SUITE_FILES)


def suite_files(name: str, split: str, benchmark: str | None = None) -> list[Path]:
    """The files ``load_suite(name, split, benchmark=benchmark)`` reads, in order."""
    if name not in SUITE_FILES:
        raise ValueError(f"unknown suite {name!r}; choose one of {sorted(SUITE_FILES)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    files = SUITE_FILES[name][split]
    if benchmark is not None:
        if benchmark not in files:
            raise ValueError(f"suite {name!r} has no {split} benchmark {benchmark!r}; choose one of {sorted(files)}")
        return [DATASETS_DIR / files[benchmark]]
    if not files:
        raise DatasetError(f"suite {name!r} has no {split} split (no shipped training pool)")
    names = DEFAULT_EVAL[name] if split == "eval" else DEFAULT_TRAIN[name]
    return [DATASETS_DIR / files[b] for b in names]


def suite_path(name: str, split: str, benchmark: str | None = None) -> Path:
    """Path of one shipped suite file; ``benchmark`` is needed when the split has several."""
    paths = suite_files(name, split, benchmark)
    if len(paths) != 1:
        raise ValueError(f"suite {name!r} {split} has {len(paths)} files; pass benchmark= "
                         f"(one of {sorted(SUITE_FILES[name][split])})")
    return paths[0]


def load_suite(name: str, split: str, limit: int | None = None, benchmark: str | None = None) -> list[Task]:
    """Shipped tasks of suite ``name`` (math, mhqa, code, web) and ``split`` (train, eval).

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
        tasks += load_tasks(path, limit=None if limit is None else limit - len(tasks))
    return tasks
