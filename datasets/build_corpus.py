"""Build the shipped HotpotQA task files and the local Wikipedia passage corpus.

This documents how ``datasets/mhqa/hotpotqa/*.jsonl`` and
``datasets/corpus/wiki_passages.jsonl.gz`` were made.  It reads the read-only source
checkout (``/work/shared/datasets`` by default, override with ``--shared``) and is NOT used
at run time: the lab only reads the files this script writes.

Run:  PYTHONPATH=. python datasets/build_corpus.py

Choices (the WHY is in the comments below):
- HotpotQA eval  = the first 200 rows of the IRCoT dev500 sample (HotpotQA dev distractor).
- HotpotQA train = all 100 rows of the HippoRAG train sample + the remaining 300 dev500 rows.
- Corpus = every paragraph of those questions (supporting + distractors) plus the 2Wiki and
  MuSiQue paragraphs/corpora shipped next to them, deduplicated by (title, text).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
from pathlib import Path
from typing import Any, Iterable, Iterator

from coa_lab.tasks.scorers import normalize_answer

HERE = Path(__file__).resolve().parent
EVAL_ROWS = 200  # dev500 rows kept for evaluation; the rest become training rows


def clean(text: str) -> str:
    # Sources disagree on whitespace (IRCoT joins sentences with two spaces, HotpotQA keeps a
    # leading space per sentence); collapsing it makes the same paragraph dedupe to one.
    return " ".join(str(text).split())


def passage_id(title: str, text: str) -> str:
    # Content hash, so ids stay stable if the corpus is rebuilt with more sources.
    return "p" + hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:12]


def sentences_to_text(sentences: Iterable[str]) -> str:
    return clean(" ".join(sentences))


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def maybe_literal(value: Any) -> Any:
    # Some shipped 2Wiki/MuSiQue files store lists as Python-repr strings.
    if isinstance(value, str) and value[:1] in "[{":
        import ast

        return ast.literal_eval(value)
    return value


class Corpus:
    """Insertion-ordered, (title, text)-deduplicated passage store."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], dict[str, str]] = {}
        self.origin_counts: dict[str, int] = {}

    def add(self, title: str, text: str, origin: str) -> str:
        title, text = clean(title), clean(text)
        key = (title, text)
        if key not in self.rows:
            self.rows[key] = {"id": passage_id(title, text), "title": title, "text": text}
            self.origin_counts[origin] = self.origin_counts.get(origin, 0) + 1
        return self.rows[key]["id"]


def hotpot_tasks(shared: Path, corpus: Corpus) -> tuple[list[dict], list[dict]]:
    dev_path = shared / "mhqa/hotpotqa_dev_ircot500/dev_subsampled.jsonl"
    train_path = shared / "mhqa/hotpotqa_train_hipporag100/hotpotqa_train.json"
    dev_rows: list[dict] = []
    for i, row in enumerate(read_jsonl(dev_path)):
        supporting = []
        for ctx in row["contexts"]:
            pid = corpus.add(ctx["title"], ctx["paragraph_text"], "hotpotqa_dev_ircot500")
            if ctx["is_supporting"] in (True, "True", "true"):
                supporting.append({"title": clean(ctx["title"]), "passage_id": pid})
        answers = [s for obj in row["answers_objects"] for s in obj["spans"]]
        dev_rows.append({
            "id": f"hotpotqa-{row['question_id']}",
            "question": row["question_text"],
            "answers": answers,
            "source": "hotpotqa",
            "profile": "mhqa",
            "metadata": {"origin": "hotpotqa_dev_ircot500", "origin_row": i, "supporting": supporting},
        })
    train_rows: list[dict] = []
    for i, row in enumerate(json.loads(train_path.read_text(encoding="utf-8"))):
        by_title = {}
        for title, sentences in maybe_literal(row["context"]):
            by_title[clean(title)] = corpus.add(title, sentences_to_text(sentences), "hotpotqa_train_hipporag100")
        support_titles = list(dict.fromkeys(clean(t) for t, _ in maybe_literal(row["supporting_facts"])))
        train_rows.append({
            "id": f"hotpotqa-{row['_id']}",
            "question": row["question"],
            "answers": [row["answer"]],
            "source": "hotpotqa",
            "profile": "mhqa",
            "metadata": {
                "origin": "hotpotqa_train_hipporag100", "origin_row": i,
                "type": row.get("type"), "level": row.get("level"),
                "supporting": [{"title": t, "passage_id": by_title[t]} for t in support_titles],
            },
        })
    # The IRCoT sample is already a random draw from HotpotQA dev, so "first N" is unbiased.
    eval_rows, spare_dev = dev_rows[:EVAL_ROWS], dev_rows[EVAL_ROWS:]
    for r in spare_dev:
        r["metadata"]["note"] = "HotpotQA dev question used for training (disjoint from eval)"
    train = train_rows + spare_dev
    check_disjoint(train, eval_rows)
    return train, eval_rows


def check_disjoint(train: list[dict], eval_rows: list[dict]) -> None:
    train_ids = {r["id"] for r in train}
    train_q = {normalize_answer(r["question"]) for r in train}
    clash = [r["id"] for r in eval_rows if r["id"] in train_ids or normalize_answer(r["question"]) in train_q]
    if clash:
        raise SystemExit(f"train/eval overlap: {clash[:5]}")


def add_distractor_corpora(shared: Path, corpus: Corpus) -> None:
    wiki2 = shared / "mhqa/2wikimultihopqa_dev"
    for p in json.loads((wiki2 / "2wikimultihopqa_corpus.json").read_text(encoding="utf-8")):
        corpus.add(p["title"], p["text"], "2wikimultihopqa_corpus")
    for row in read_jsonl(wiki2 / "2wiki_dev500_with_context.jsonl"):
        for title, sentences in maybe_literal(row["context"]):
            corpus.add(title, sentences_to_text(sentences), "2wiki_dev500_with_context")
    musique = shared / "mhqa/musique_train_hipporag100"
    for p in json.loads((musique / "musique_train_corpus.json").read_text(encoding="utf-8")):
        corpus.add(p["title"], p["text"], "musique_train_corpus")
    hp_corpus = shared / "mhqa/hotpotqa_train_hipporag100/hotpotqa_train_corpus.json"
    for title, sentences in json.loads(hp_corpus.read_text(encoding="utf-8")).items():
        corpus.add(title, sentences_to_text(sentences), "hotpotqa_train_corpus")


def origin(shared: Path, folder: str, file: str) -> dict[str, Any]:
    """The provenance entry of one source file, copied from its SOURCE.json."""
    for entry in json.loads((shared / folder / "SOURCE.json").read_text(encoding="utf-8")):
        if entry["file"] == file:
            keep = ("source_repo", "commit", "path", "license")
            return {"shared_file": f"{folder}/{file}", **{k: entry[k] for k in keep if k in entry}}
    raise SystemExit(f"{folder}/SOURCE.json has no entry for {file}")


def shipped_entry(path: Path, rows: int, subset: str, origins: list[dict], note: str = "") -> dict[str, Any]:
    data = path.read_bytes()
    return {
        "file": path.name, "rows": rows, "size_bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(), "subset": subset, "note": note,
        "origins": origins,
    }


def write_source(folder: Path, entries: list[dict]) -> None:
    (folder / "SOURCE.json").write_text(json.dumps(entries, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def write_jsonl(path: Path, rows: Iterable[dict], gz: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    if gz:
        # mtime=0 keeps the archive byte-identical across rebuilds (clean git diffs).
        with path.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=9) as fh:
            fh.write(data)
    else:
        path.write_bytes(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=Path("/work/shared/datasets"))
    args = parser.parse_args()
    corpus = Corpus()
    # HotpotQA first, so its paragraphs keep their origin label in the counts.
    train, eval_rows = hotpot_tasks(args.shared, corpus)
    add_distractor_corpora(args.shared, corpus)
    write_jsonl(HERE / "mhqa/hotpotqa/train.jsonl", train)
    write_jsonl(HERE / "mhqa/hotpotqa/eval.jsonl", eval_rows)
    write_jsonl(HERE / "corpus/wiki_passages.jsonl.gz", corpus.rows.values(), gz=True)
    sh = args.shared
    dev = origin(sh, "mhqa/hotpotqa_dev_ircot500", "dev_subsampled.jsonl")
    hip = origin(sh, "mhqa/hotpotqa_train_hipporag100", "hotpotqa_train.json")
    layout = "coa_lab Task layout (id, question, answers, source, profile, metadata); metadata.supporting = [{title, passage_id}] into corpus/wiki_passages.jsonl.gz"
    write_source(HERE / "mhqa/hotpotqa", [
        shipped_entry(HERE / "mhqa/hotpotqa/eval.jsonl", len(eval_rows),
                      f"first {EVAL_ROWS} rows (file order) of the IRCoT HotpotQA dev500 sample", [dev], layout),
        shipped_entry(HERE / "mhqa/hotpotqa/train.jsonl", len(train),
                      f"all 100 HippoRAG train rows, then dev500 rows {EVAL_ROWS + 1}-500 (file order); disjoint from eval by id and normalized question",
                      [hip, dev], layout),
    ])
    corpus_origins = [
        dev, hip,
        origin(sh, "mhqa/hotpotqa_train_hipporag100", "hotpotqa_train_corpus.json"),
        origin(sh, "mhqa/2wikimultihopqa_dev", "2wikimultihopqa_corpus.json"),
        origin(sh, "mhqa/2wikimultihopqa_dev", "2wiki_dev500_with_context.jsonl"),
        origin(sh, "mhqa/musique_train_hipporag100", "musique_train_corpus.json"),
    ]
    write_source(HERE / "corpus", [shipped_entry(
        HERE / "corpus/wiki_passages.jsonl.gz", len(corpus.rows),
        "all paragraphs of the listed origins, whitespace-collapsed, deduplicated by (title, text); "
        f"new passages per origin in build order: {json.dumps(corpus.origin_counts)}",
        corpus_origins,
        "gzip JSON lines {id, title, text}; id = 'p' + sha1(title\\ntext)[:12]; Wikipedia text is CC BY-SA; built by datasets/build_corpus.py",
    )])
    print(f"hotpotqa train={len(train)} eval={len(eval_rows)} corpus={len(corpus.rows)}")
    print("new passages by origin:", json.dumps(corpus.origin_counts, indent=1))


if __name__ == "__main__":
    main()
