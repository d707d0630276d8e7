"""Shipped data hygiene: no leakage between train, val and test, corpus covers HotpotQA
evidence, provenance files present, and every gold answer scores 1.0 against itself."""

from __future__ import annotations

import gzip
import itertools
import json
import pytest

from coa_lab.paths import DATASETS_DIR
from coa_lab.tasks import load_suite, normalize_answer, score
from coa_lab.tasks.arithmetic import name_free
from coa_lab.tasks.suites import SUITE_FILES

TRAJECTORIES = DATASETS_DIR / "trajectories"
TEACHER_RUNS = DATASETS_DIR / "teacher_runs" / "smollm2_135m_cpu_tiny.jsonl"
FAMILIES = {"math": "arith", "mhqa": "lookup"}  # suite -> the learnable family with train/val/test
# The one known overlap, kept because val must stay exactly the old eval set: a sticker story
# that differs from a train one only by the buyer's name (same expression). Test has none.
KNOWN_VAL_TRAIN_OVERLAPS = {("arith-train-820", "arith-val-97")}


def _trajectory_questions() -> dict[str, set[str]]:
    fireact = [json.loads(l)["messages"][0]["content"] for l in (TRAJECTORIES / "fireact_hotpotqa_react.jsonl").open()]
    tora_rows = [json.loads(l) for l in (TRAJECTORIES / "tora70b_gsm8k.jsonl").open()]
    r1searcher = [json.loads(l)["question"] for l in (TRAJECTORIES / "r1searcher_hotpotqa_qwen.jsonl").open()]
    return {
        "questions": {normalize_answer(q) for q in fireact + r1searcher + [r["question"] for r in tora_rows]},
        "ids": {f"gsm8k-test-{r['idx']}" for r in tora_rows},
    }


def _all(split: str) -> dict[str, list]:
    """Every shipped file of a split (all benchmarks, not only the defaults) -> its tasks."""
    return {f"{suite}/{bench}": load_suite(suite, split, benchmark=bench)
            for suite, splits in SUITE_FILES.items() for bench in splits[split]}


@pytest.fixture(scope="module")
def eval_files():
    """Every held-out split: val, test ("eval" and "selection" are aliases of test) and confirm."""
    return {f"{name} ({split})": tasks for split in ("val", "test", "confirm") for name, tasks in _all(split).items()}


@pytest.fixture(scope="module")
def eval_tasks(eval_files):
    return [t for tasks in eval_files.values() for t in tasks]


@pytest.fixture(scope="module")
def corpus():
    with gzip.open(DATASETS_DIR / "corpus" / "wiki_passages.jsonl.gz", "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def test_train_pools_and_trajectories_disjoint_from_eval(eval_files, eval_tasks):
    eval_ids = {t.id for t in eval_tasks}
    eval_q = {normalize_answer(t.question) for t in eval_tasks}
    train = [t for tasks in _all("train").values() for t in tasks]
    assert {t.source for t in train} >= {"gsm8k", "hotpotqa", "mbpp"}
    for name, tasks in eval_files.items():  # per file, so a failure names the eval set
        assert not {t.id for t in tasks} & {t.id for t in train}, name
        assert not {normalize_answer(t.question) for t in tasks} & {normalize_answer(t.question) for t in train}, name
    traj = _trajectory_questions()
    assert not eval_q & traj["questions"]
    assert not eval_ids & traj["ids"]


def test_eval_is_an_alias_of_test():
    for splits in SUITE_FILES.values():
        assert splits["eval"] is splits["test"]


def test_no_duplicate_ids_within_or_across_files(eval_tasks):
    for split in ("train", "val", "test"):
        for name, tasks in _all(split).items():
            ids = [t.id for t in tasks]
            assert len(ids) == len(set(ids)), (name, split)
    ids = [t.id for t in eval_tasks]
    assert len(ids) == len(set(ids))  # ids are unique across every val and test set too


@pytest.fixture(scope="module")
def families():
    return {f"{suite}/{bench}": {split: load_suite(suite, split, benchmark=bench) for split in ("train", "val", "test", "confirm")}
            for suite, bench in FAMILIES.items()}


def _overlaps(a: list, b: list, key) -> set[tuple[str, str]]:
    """(id in a, id in b) of every pair of tasks with the same key."""
    by_key: dict = {}
    for t in b:
        by_key.setdefault(key(t), []).append(t.id)
    return {(t.id, other) for t in a for other in by_key.get(key(t), [])}


def test_learnable_family_splits_are_pairwise_disjoint(families):
    keys = {"id": lambda t: t.id, "question": lambda t: normalize_answer(t.question)}
    arith_keys = {"expression": lambda t: t.metadata["expression"],
                  "name-swapped question": lambda t: normalize_answer(name_free(t.question))}
    for name, splits in families.items():
        assert all(splits.values()), name
        for (a, tasks_a), (b, tasks_b) in itertools.combinations(splits.items(), 2):
            for what, key in {**keys, **(arith_keys if name == "math/arith" else {})}.items():
                found = _overlaps(tasks_a, tasks_b, key)
                allowed = KNOWN_VAL_TRAIN_OVERLAPS if (a, b) == ("train", "val") and what in arith_keys else set()
                assert found == allowed, (name, a, b, what, sorted(found))


def test_teacher_runs_are_on_train_tasks(families):
    train = {t.id: t for splits in families.values() for t in splits["train"]}
    runs = [json.loads(line) for line in TEACHER_RUNS.open(encoding="utf-8")]
    assert runs
    for run in runs:
        assert run["task_id"] in train, run["task_id"]
        assert run["question"] == train[run["task_id"]].question, run["task_id"]  # the id still names that task


def test_corpus_shape_and_dedup(corpus):
    assert len(corpus) >= 10_000
    assert all(set(p) == {"id", "title", "text"} and p["text"] for p in corpus)
    assert len({(p["title"], p["text"]) for p in corpus}) == len(corpus)
    assert len({p["id"] for p in corpus}) == len(corpus)


def test_corpus_has_every_supporting_paragraph(corpus):
    by_id = {p["id"]: p for p in corpus}
    # The default mhqa splits (HotpotQA train/eval, 2Wiki eval) must be answerable offline.
    for task in load_suite("mhqa", "train") + load_suite("mhqa", "eval"):
        support = task.metadata["supporting"]
        assert len(support) >= 2, task.id
        for s in support:
            assert s["passage_id"] in by_id, (task.id, s)
            assert by_id[s["passage_id"]]["title"] == s["title"]


def test_every_source_json_is_present_and_parseable():
    data_files = [p for p in DATASETS_DIR.rglob("*") if p.is_file() and p.suffix in (".jsonl", ".gz", ".parquet")]
    assert data_files
    for path in data_files:
        source = path.parent / "SOURCE.json"
        assert source.exists(), f"{path} has no SOURCE.json next to it"
        entries = json.loads(source.read_text(encoding="utf-8"))
        entry = next((e for e in entries if e["file"] == path.name), None)
        assert entry is not None, f"{source} does not describe {path.name}"
        assert entry["subset"] and entry["origins"]
        assert all(o["source_repo"] and o["commit"] and o["license"] for o in entry["origins"])
        assert entry["size_bytes"] == path.stat().st_size


def test_datasets_stay_lean():
    total = sum(p.stat().st_size for p in DATASETS_DIR.rglob("*") if p.is_file())
    assert total <= 40 * 1024 * 1024


@pytest.mark.parametrize("name, split", [(n, s) for n in ("math", "mhqa") for s in ("train", "val", "test")])
def test_gold_answers_score_one(name, split):
    # Raw golds (no <answer> wrapper); tests/tasks/test_gold_selftest.py covers the full answer path.
    for task in load_suite(name, split):
        for gold in task.answers:
            assert score(task, gold) == 1.0, (task.id, gold)
            if task.profile == "math":
                assert score(task, f"\\boxed{{{gold}}}") == 1.0, (task.id, gold)


def test_every_code_task_has_tests_and_readme_lists_every_file(eval_files):
    readme = (DATASETS_DIR / "README.md").read_text(encoding="utf-8")
    for name, tasks in eval_files.items():
        assert tasks, name
        if name.startswith("code/"):
            assert all(t.profile == "code" and t.metadata["tests"]["cases"] for t in tasks), name
    for suite, splits in SUITE_FILES.items():
        for split in splits.values():
            for rel in split.values():
                assert f"`{rel}`" in readme, f"datasets/README.md has no row for {rel}"
