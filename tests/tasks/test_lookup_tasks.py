"""The single-hop look-up family: real 2Wiki facts, answerable from the shipped corpus, and
train / val / test split as datasets/build_lookup.py says."""

import hashlib
import json
import random
import sys
from collections import Counter
from pathlib import Path

import pytest

from coa_lab.paths import DATASETS_DIR
from coa_lab.tasks.scorers import normalize_answer, score
from coa_lab.tasks.loaders import load_tasks
from coa_lab.tasks.suites import load_suite
from coa_lab.tools.wiki_search import WikiSearch

SPLITS = ("train", "val", "test")
SHARED = Path("/work/shared/datasets")
FOLDER = DATASETS_DIR / "mhqa" / "lookup"
# train.jsonl must not move (capture, RL and datasets/teacher_runs use its ids); val + test are
# the old eval.jsonl's 374 rows: the sha256 of those rows without ids, as sorted JSON lines
OLD_TRAIN_SHA256 = "e6ad00becc138fe81d1a95c069ceb2cc9ec7f410addd547dea8f932ac619f5f0"
OLD_EVAL_ROWS, OLD_EVAL_SORTED_SHA256 = 374, "d2dcfc400f897581585e5dbd417905af909d09d961f7ad4b060eb32d53454746"


@pytest.fixture(scope="module")
def lookups():
    """Each split FILE's rows ("test" = the whole test file: selection + confirmation + excluded)."""
    return {split: load_tasks(FOLDER / f"{split}.jsonl") for split in SPLITS}


def test_heldout_splits_are_disjoint_by_subject_and_source_row(lookups):
    # A look-up's 2Wiki source row carries up to 10 facts about related people and films: two
    # tasks from one row are not independent, so the confirmation split shares no subject and no
    # source row with any other split, not only no id or question
    split = {s: load_suite("mhqa", s, benchmark="lookup") for s in ("train", "val", "selection", "confirm")}
    assert len(split["selection"]) == 48 and len(split["confirm"]) >= 60
    assert [t.id for t in load_suite("mhqa", "test", benchmark="lookup")] == [t.id for t in split["selection"]]
    keys = {s: ({t.metadata["subject"] for t in ts}, {t.metadata["origin_row"] for t in ts}) for s, ts in split.items()}
    for other in ("train", "val", "selection"):
        assert not keys["confirm"][0] & keys[other][0], other
        assert not keys["confirm"][1] & keys[other][1], other
        assert not {t.id for t in split["confirm"]} & {t.id for t in split[other]}, other
    assert not keys["train"][1] & (keys["val"][1] | keys["selection"][1])
    # the one known exception: val holds the 16 tasks the demo tuned on, moved there from rows
    # 100-199, so val and the selection split share source rows (never subjects)
    assert not keys["val"][0] & keys["selection"][0]
    assert keys["val"][1] & keys["selection"][1] <= {t.metadata["origin_row"] for t in split["val"]
                                                     if t.metadata["origin_row"] >= 100}
    # every test-file row is in exactly one of selection, confirmation, excluded
    manifest = json.loads((DATASETS_DIR / "heldout_splits.json").read_text())["families"]["mhqa/lookup"]
    parts = manifest["selection"] + manifest["confirm"] + manifest["excluded"]
    assert sorted(parts) == sorted(t.id for t in lookups["test"]) and len(set(parts)) == len(parts)


def test_splits_are_disjoint_by_question_and_subject(lookups):
    assert len(lookups["train"]) > 300 and len(lookups["val"]) > 150 and len(lookups["test"]) > 150
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        assert not {t.question for t in lookups[a]} & {t.question for t in lookups[b]}, (a, b)
        assert not {t.metadata["subject"] for t in lookups[a]} & {t.metadata["subject"] for t in lookups[b]}, (a, b)
    assert all(t.metadata["origin_row"] >= 200 for t in lookups["train"])
    assert all(t.metadata["origin_row"] < 200 for t in lookups["val"] + lookups["test"])
    assert all(t.metadata["origin_row"] >= 100 for t in lookups["test"])
    for split in SPLITS:
        assert [t.id for t in lookups[split]] == [f"lookup-{split}-{i}" for i in range(len(lookups[split]))]
    assert [t.id for t in load_suite("mhqa", "eval", benchmark="lookup")] == \
        [t.id for t in load_suite("mhqa", "selection", benchmark="lookup")]


def test_train_is_unchanged_and_val_plus_test_is_the_old_eval_set():
    assert hashlib.sha256((FOLDER / "train.jsonl").read_bytes()).hexdigest() == OLD_TRAIN_SHA256
    rows = [json.loads(line) for split in ("val", "test") for line in (FOLDER / f"{split}.jsonl").open()]
    lines = sorted(json.dumps({k: v for k, v in r.items() if k != "id"}, ensure_ascii=False) for r in rows)
    assert len(rows) == OLD_EVAL_ROWS
    assert hashlib.sha256("\n".join(lines).encode()).hexdigest() == OLD_EVAL_SORTED_SHA256


def test_val_holds_exactly_the_tasks_the_demo_tuned_on_from_rows_100_on(lookups):
    # The demo drew random.Random(0).shuffle(old eval)[:16]; a shuffle's permutation depends on
    # the length only, and the old file was in origin_row order, so old index i sat in row
    # sorted(origin rows)[i]. Rows 100-199 must be test except for those 16 tuned-on tasks.
    held_out = lookups["val"] + lookups["test"]
    order = list(range(len(held_out)))
    random.Random(0).shuffle(order)
    rows = sorted(t.metadata["origin_row"] for t in held_out)
    tuned_rows = Counter(rows[i] for i in order[:16] if rows[i] >= 100)
    assert Counter(t.metadata["origin_row"] for t in lookups["val"] if t.metadata["origin_row"] >= 100) == tuned_rows


@pytest.mark.skipif(not SHARED.exists(), reason="source checkout /work/shared not available")
def test_build_script_rebuilds_the_shipped_files_byte_identically(tmp_path):
    sys.path.insert(0, str(DATASETS_DIR))
    try:
        import build_lookup
    finally:
        sys.path.remove(str(DATASETS_DIR))
    build_lookup.main(tmp_path)
    for name in ("train.jsonl", "val.jsonl", "test.jsonl", "SOURCE.json"):
        assert (tmp_path / name).read_bytes() == (FOLDER / name).read_bytes(), name
    assert not (FOLDER / "eval.jsonl").exists()


def test_every_lookup_is_answerable_by_searching_its_subject(lookups):
    search = WikiSearch(k=3)
    for task in lookups["val"][:60] + lookups["test"][:60] + lookups["train"][:120]:
        seen = search.run(task.metadata["subject"]).text[:300]  # what a cpu-tiny rollout sees
        assert normalize_answer(task.answers[0]) in normalize_answer(seen), task.question
        assert score(task, task.answers[0]) == 1.0 and score(task, "Zanzibar Qx") == 0.0
