"""Build the single-hop look-up family ``datasets/mhqa/lookup/{train,eval}.jsonl``.

Each task asks for ONE fact of 2WikiMultihopQA's evidence triples (subject, relation,
object), e.g. ("Sleep, My Love", "director", "Douglas Sirk") -> "Who directed the film
Sleep, My Love?", answer "Douglas Sirk". A task is kept only when the fact is *retrievable*
with the shipped tools: searching the subject's name with the lab's own ``wiki_search``
(BM25 over ``corpus/wiki_passages.jsonl.gz``) shows the answer within the first
``OBSERVATION_CHARS`` characters of the observation -- the part a cpu-tiny rollout sees.
So a model that searches well can score ~1, one answering from memory ~0.

Splits: eval from the 2Wiki dev rows our 2Wiki eval file already uses (rows 0-199), train
from rows 200-499; a subject never appears in both. Not used at run time:

    PYTHONPATH=. python datasets/build_lookup.py
"""

from __future__ import annotations

import json
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
    out: dict[str, list[dict]] = {"eval": [], "train": []}
    seen_subjects: dict[str, str] = {}  # subject -> split: a subject lives in one split only
    for index, row in enumerate(rows):
        split = "eval" if index < EVAL_ROWS else "train"
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


def main() -> None:
    out = build()
    folder = HERE / "mhqa" / "lookup"
    entries = []
    for split in ("train", "eval"):
        path = folder / f"{split}.jsonl"
        write_jsonl(path, out[split])
        entries.append(shipped_entry(
            path, len(out[split]),
            f"2Wiki dev500 rows {'0-199' if split == 'eval' else '200-499'}: every evidence triple of the "
            f"relations {sorted(TEMPLATES)} turned into a question whose answer BM25 shows within "
            f"{OBSERVATION_CHARS} characters when searching the subject",
            [{**origin(SHARED, ORIGIN_FOLDER, ORIGIN_FILE), "shared_file": f"{ORIGIN_FOLDER}/{ORIGIN_FILE}"}],
            note="coa_lab Task layout; metadata.relation/subject/origin_row; built by datasets/build_lookup.py",
        ))
        print(split, len(out[split]))
    write_source(folder, entries)


if __name__ == "__main__":
    main()
