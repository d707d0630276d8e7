"""Build the single-hop look-up family ``datasets/mhqa/lookup/{train,val,test}.jsonl``.

Each task asks for ONE fact of 2WikiMultihopQA's evidence triples (subject, relation,
object), e.g. ("Sleep, My Love", "director", "Douglas Sirk") -> "Who directed the film
Sleep, My Love?", answer "Douglas Sirk". A task is kept only when the fact is *retrievable*
with the shipped tools: searching the subject's name with the lab's own ``wiki_search``
(BM25 over ``corpus/wiki_passages.jsonl.gz``) shows the answer within the first
``OBSERVATION_CHARS`` characters of the observation -- the part a cpu-tiny rollout sees.
So a model that searches well can score ~1, one answering from memory ~0.

Splits: train from 2Wiki dev rows 200-499; held-out from the rows our 2Wiki eval file already
uses (0-199), and a subject never appears in both train and held-out. The held-out rows were
once one eval file, and the lab tuned on it: the cpu-tiny demo drew 16 look-ups from it
(``random.Random(0).shuffle(tasks); tasks[:16]``). So they are split, keeping their order:

- test: held-out rows from 2Wiki rows 100-199, minus those 16 tuned-on tasks; not tuned on when
  split off (later RL benchmarks read part of it: the selection split, datasets/heldout_splits.json).
- val: every other held-out row (rows 0-99 and the 16); every tuning decision is made here.

Not used at run time:

    PYTHONPATH=. python datasets/build_lookup.py
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from build_corpus import origin, read_jsonl, shipped_entry, write_jsonl, write_source  # noqa: E402

from coa_lab.tasks.scorers import normalize_answer  # noqa: E402
from coa_lab.tools.wiki_search import WikiSearch  # noqa: E402

SHARED = Path("/work/shared/datasets")
ORIGIN_FOLDER, ORIGIN_FILE = "mhqa/2wikimultihopqa_dev", "2wiki_dev500_with_context.jsonl"
EVAL_ROWS = 200  # rows 0..199 are the shipped 2Wiki eval questions
TEST_FROM_ROW = 100  # held-out tasks from 2Wiki rows 100-199 can be test ...
TUNED_SEED, TUNED_ROWS = 0, 16  # ... unless the demo tuned on them (see held_out_splits)
OBSERVATION_CHARS = 300  # cpu-tiny's gen.observation_chars: the answer must be visible in it

TEMPLATES = {
    "director": "Who directed the film {s}?",
    "date of birth": "When was {s} born?",
    "date of death": "When did {s} die?",
    "place of birth": "Where was {s} born?",
    "place of death": "Where did {s} die?",
    "publication date": "In what year was the film {s} released?",
    "father": "Who was the father of {s}?",
    "mother": "Who was the mother of {s}?",
    "spouse": "Who was the spouse of {s}?",
    "country of citizenship": "What country was {s} a citizen of?",
}


def build(shared: Path = SHARED) -> dict[str, list[dict]]:
    rows = list(read_jsonl(shared / ORIGIN_FOLDER / ORIGIN_FILE))
    search = WikiSearch(k=3)
    out: dict[str, list[dict]] = {"heldout": [], "train": []}  # held_out_splits makes val and test
    seen_subjects: dict[str, str] = {}  # subject -> split: a subject lives in one split only
    for index, row in enumerate(rows):
        split = "heldout" if index < EVAL_ROWS else "train"
        evidences = row["evidences"]
        if isinstance(evidences, str):
            evidences = json.loads(evidences.replace("'", '"'))
        for subject, relation, obj in evidences:
            if relation not in TEMPLATES or seen_subjects.get(subject, split) != split:
                continue
            question = TEMPLATES[relation].format(s=subject)
            if any(t["question"] == question for t in out[split]):
                continue
            observation = search.run(subject).text[:OBSERVATION_CHARS]
            if normalize_answer(obj) not in normalize_answer(observation):
                continue  # not retrievable with the obvious query: not a look-up
            seen_subjects[subject] = split
            out[split].append({
                "id": f"lookup-{split}-{len(out[split])}", "question": question, "answers": [obj],
                "source": "lookup", "profile": "mhqa",
                "metadata": {"family": "lookup", "relation": relation, "subject": subject,
                             "origin_row": index, "origin_id": row["_id"]},
            })
    return out


def held_out_splits(held_out: list[dict]) -> dict[str, list[dict]]:
    """Split the held-out rows (the old eval file, in its order) into val and test.

    The demo (preset seed 0) drew its 16 eval look-ups as ``random.Random(0).shuffle(tasks);
    tasks[:16]`` over that file; a shuffle's permutation depends only on the list's length, so
    shuffling the row indices finds the same 16 without the old file.
    """
    order = list(range(len(held_out)))
    random.Random(TUNED_SEED).shuffle(order)
    tuned = set(order[:TUNED_ROWS])
    out: dict[str, list[dict]] = {"val": [], "test": []}
    for index, row in enumerate(held_out):
        split = "test" if row["metadata"]["origin_row"] >= TEST_FROM_ROW and index not in tuned else "val"
        out[split].append({**row, "id": f"lookup-{split}-{len(out[split])}"})
    return out


ROWS = {  # SOURCE.json: which 2Wiki rows each file comes from, and what it is for
    "train": "2Wiki dev500 rows 200-499",
    "val": f"the old eval file (2Wiki dev500 rows 0-{EVAL_ROWS - 1}), its tasks from rows 0-{TEST_FROM_ROW - 1} "
           f"plus the {TUNED_ROWS} the cpu-tiny demo tuned on",
    "test": f"the old eval file (2Wiki dev500 rows 0-{EVAL_ROWS - 1}), its tasks from rows {TEST_FROM_ROW}-"
            f"{EVAL_ROWS - 1} minus the {TUNED_ROWS} the cpu-tiny demo tuned on",
}
ROLES = {"train": "", "val": "; every tuning decision is made on val",
         "test": "; made after tuning; part of it was read since to choose RL settings (the selection split), the rest is the unread confirmation split (datasets/heldout_splits.json)"}


def main(folder: Path = HERE / "mhqa" / "lookup") -> None:
    """Write train/val/test and SOURCE.json into `folder` (a test rebuilds into a temp dir)."""
    out = build()
    out.update(held_out_splits(out.pop("heldout")))
    entries = []
    for split in ("train", "val", "test"):
        path = folder / f"{split}.jsonl"
        write_jsonl(path, out[split])
        entries.append(shipped_entry(
            path, len(out[split]),
            f"{ROWS[split]}: every evidence triple of the "
            f"relations {sorted(TEMPLATES)} turned into a question whose answer BM25 shows within "
            f"{OBSERVATION_CHARS} characters when searching the subject{ROLES[split]}",
            [{**origin(SHARED, ORIGIN_FOLDER, ORIGIN_FILE), "shared_file": f"{ORIGIN_FOLDER}/{ORIGIN_FILE}"}],
            note="coa_lab Task layout; metadata.relation/subject/origin_row; built by datasets/build_lookup.py",
        ))
        print(split, len(out[split]))
    write_source(folder, entries)


if __name__ == "__main__":
    main()
