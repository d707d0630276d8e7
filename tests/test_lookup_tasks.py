"""The single-hop look-up family: real 2Wiki facts, answerable from the shipped corpus."""

import pytest

from coa_lab.tasks.scorers import normalize_answer, score
from coa_lab.tasks.suites import load_suite
from coa_lab.tools.wiki_search import WikiSearch


@pytest.fixture(scope="module")
def lookups():
    return {split: load_suite("mhqa", split, benchmark="lookup") for split in ("train", "eval")}


def test_splits_are_disjoint_by_question_and_subject(lookups):
    train, evals = lookups["train"], lookups["eval"]
    assert len(train) > 300 and len(evals) > 200
    assert not {t.question for t in train} & {t.question for t in evals}
    assert not {t.metadata["subject"] for t in train} & {t.metadata["subject"] for t in evals}
    assert all(t.metadata["origin_row"] < 200 for t in evals) and all(t.metadata["origin_row"] >= 200 for t in train)


def test_every_lookup_is_answerable_by_searching_its_subject(lookups):
    search = WikiSearch(k=3)
    for task in lookups["eval"][:120] + lookups["train"][:120]:
        seen = search.run(task.metadata["subject"]).text[:300]  # what a cpu-tiny rollout sees
        assert normalize_answer(task.answers[0]) in normalize_answer(seen), task.question
        assert score(task, task.answers[0]) == 1.0 and score(task, "Zanzibar Qx") == 0.0
