"""Build the shipped evaluation sets beyond GSM8K/HotpotQA (and the MBPP train pool).

Documents how ``datasets/{math,mhqa,code,web}/<benchmark>/`` were made from the read-only
source checkout (``--shared``, default ``/work/shared/datasets``); not used at run time.
Run AFTER build_corpus.py and build_subsets.py (it checks disjointness against their files):

    PYTHONPATH=. python datasets/build_eval_sets.py

Every file except LiveCodeBench is converted to the lab's Task layout *by the lab's own
loaders* (``load_tasks`` on the source file), so the shipped rows are exactly what a user
gets by loading the source file, plus ``metadata.origin``/``origin_row``.  LiveCodeBench is
the AFM parquet copied byte-for-byte (it is small and exercises the parquet loader).

Choices:
- MATH-500, AIME24, AMC23, HumanEval, GAIA (text-only dev), WebWalkerQA, Bamboogle: all rows.
- MBPP eval = the standard test split (task_ids 11-510); MBPP train pool = the train split
  (task_ids 601-974).  The prompt (1-10) and validation (511-600) splits are not shipped.
- APPS = the 49 distinct stdin/stdout problems of MapCoder's selected150 (call-based ones
  skipped; the file repeats 3 of the 52 stdin/stdout rows).
- NQ / TriviaQA / PopQA = first 200 rows of the 1000-row random subsets (already random).
- 2Wiki = first 200 rows of the 500-row dev sample whose paragraphs are in the corpus;
  ``metadata.supporting`` points into corpus/wiki_passages.jsonl.gz like HotpotQA's.
- MuSiQue = first 200 rows of R1-Searcher's 500-question MuSiQue dev eval set.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from build_corpus import HERE, clean, maybe_literal, origin, passage_id, read_jsonl, sentences_to_text, shipped_entry, write_jsonl, write_source

from coa_lab.tasks.loaders import load_tasks
from coa_lab.tasks.scorers import normalize_answer

LAYOUT = "coa_lab Task layout (id, question, answers, source, profile, metadata) made by coa_lab.tasks.load_tasks on the origin file"
CODE_LAYOUT = LAYOUT + "; metadata.tests = {style, cases, entry_point, prompt, setup} (see coa_lab/tasks/records.py), metadata.canonical_solution when the origin has one"


def convert(shared: Path, folder: str, file: str, keep=None, where=None) -> list[dict]:
    """Load a source file with the lab's loader and tag each row with its origin."""
    tasks = load_tasks(shared / folder / file, where=where)
    rows = []
    for index, task in enumerate(tasks):
        row = task.to_dict()
        row["metadata"] = {"origin": f"{folder}/{file}", **row["metadata"]}
        rows.append(row)
    return [r for r in rows if keep is None or keep(r)]


def ship(folder: str, file: str, rows: list[dict], subset: str, origins: list[dict], note: str = LAYOUT) -> dict:
    path = HERE / folder / file
    write_jsonl(path, rows)
    print(f"{folder}/{file}: {len(rows)} rows, {path.stat().st_size / 1024:.0f} KB")
    return shipped_entry(path, len(rows), subset, origins, note)


def two_wiki(shared: Path) -> list[dict]:
    folder, file = "mhqa/2wikimultihopqa_dev", "2wiki_dev500_with_context.jsonl"
    raw = list(read_jsonl(shared / folder / file))[:200]
    rows = convert(shared, folder, file)[:200]
    for row, src in zip(rows, raw):
        # Same passage ids as build_corpus.py computes for these paragraphs.
        by_title = {clean(t): passage_id(clean(t), sentences_to_text(s)) for t, s in maybe_literal(src["context"])}
        titles = list(dict.fromkeys(clean(t) for t, _ in maybe_literal(src["supporting_facts"])))
        meta = row["metadata"]
        meta.pop("context", None)  # the paragraphs are in the shipped corpus; keep the file small
        meta.pop("supporting_titles", None)
        meta["supporting"] = [{"title": t, "passage_id": by_title[t]} for t in titles]
        meta["evidences"] = maybe_literal(src.get("evidences"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=Path("/work/shared/datasets"))
    sh = parser.parse_args().shared

    def o(folder: str, file: str) -> list[dict]:
        return [origin(sh, folder, file)]

    # ---- math
    for bench, folder, file, what in [
        ("math500", "math/math500", "test.jsonl", "all 500 rows of MATH-500 (PRM800K test split)"),
        ("aime24", "math/aime2024", "aime24_test.jsonl", "all 30 AIME 2024 problems"),
        ("amc23", "math/amc23", "test.jsonl", "all 40 AMC 2023 problems"),
    ]:
        write_source(HERE / "math" / bench, [ship(f"math/{bench}", "eval.jsonl", convert(sh, folder, file), what, o(folder, file))])

    # ---- mhqa
    for bench, folder, file, n in [
        ("nq", "mhqa/nq_triviaqa_popqa_subsets", "nq_test_sub1000.jsonl", 200),
        ("triviaqa", "mhqa/nq_triviaqa_popqa_subsets", "triviaqa_test_sub1000.jsonl", 200),
        ("popqa", "mhqa/nq_triviaqa_popqa_subsets", "popqa_test_sub1000.jsonl", 200),
        ("musique", "mhqa/r1searcher_evalsets", "musique_500.jsonl", 200),
        ("bamboogle", "mhqa/bamboogle", "bamboogle.json", 125),
    ]:
        rows = convert(sh, folder, file)[:n]
        write_source(HERE / "mhqa" / bench, [ship(f"mhqa/{bench}", "eval.jsonl", rows, f"first {n} rows (file order)", o(folder, file))])
    write_source(HERE / "mhqa/2wiki", [ship("mhqa/2wiki", "eval.jsonl", two_wiki(sh),
                                           "first 200 rows (file order) of the 2Wiki dev500 sample with context",
                                           o("mhqa/2wikimultihopqa_dev", "2wiki_dev500_with_context.jsonl"),
                                           LAYOUT + "; metadata.supporting = [{title, passage_id}] into corpus/wiki_passages.jsonl.gz")])

    # ---- code
    he = convert(sh, "code/humaneval", "HumanEval.jsonl.gz")
    write_source(HERE / "code/humaneval", [ship("code/humaneval", "eval.jsonl", he, "all 164 HumanEval problems",
                                                o("code/humaneval", "HumanEval.jsonl.gz"), CODE_LAYOUT)])
    mbpp_id = lambda r: int(r["id"].split("-")[1])  # noqa: E731
    mbpp = convert(sh, "code/mbpp", "mbpp.jsonl")
    write_source(HERE / "code/mbpp", [
        ship("code/mbpp", "eval.jsonl", [r for r in mbpp if 11 <= mbpp_id(r) <= 510],
             "MBPP test split (task_ids 11-510, 500 rows)", o("code/mbpp", "mbpp.jsonl"), CODE_LAYOUT),
        ship("code/mbpp", "train.jsonl", [r for r in mbpp if 601 <= mbpp_id(r) <= 974],
             "MBPP train split (task_ids 601-974, 374 rows): the code train pool", o("code/mbpp", "mbpp.jsonl"), CODE_LAYOUT),
    ])
    apps = convert(sh, "code/apps_selected150", "selected150.jsonl", where=lambda r: not str(r["starter_code"]).strip())
    # selected150 repeats some problems (same id, same text): keep the first of each.
    apps = list({r["id"]: r for r in reversed(apps)}.values())[::-1]
    write_source(HERE / "code/apps", [ship("code/apps", "eval.jsonl", apps, f"the {len(apps)} distinct stdin/stdout problems (empty starter_code; 52 rows, 3 repeated ids) of selected150",
                                           o("code/apps_selected150", "selected150.jsonl"), CODE_LAYOUT)])
    lcb_dir = HERE / "code/livecodebench"
    lcb_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(sh / "afm_benchmarks/livecodebench_v4.parquet", lcb_dir / "livecodebench_v4.parquet")
    write_source(lcb_dir, [shipped_entry(lcb_dir / "livecodebench_v4.parquet", 100, "all 100 rows, file copied byte-for-byte",
                                         o("afm_benchmarks", "livecodebench_v4.parquet"),
                                         "AFM/verl parquet (data_source, prompt, ability, reward_model, extra_info); 65 stdin/stdout + 35 functional (Solution class) problems; read by load_tasks' afm layout")])

    # ---- web
    write_source(HERE / "web/gaia", [ship("web/gaia", "eval.jsonl", convert(sh, "afm_benchmarks", "gaia_dev_103.json"),
                                          "all 103 text-only GAIA dev questions of the AFM copy", o("afm_benchmarks", "gaia_dev_103.json"))])
    write_source(HERE / "web/webwalker", [ship("web/webwalker", "eval.jsonl", convert(sh, "afm_benchmarks", "webwalker_main.json"),
                                               "all 680 rows of WebWalkerQA main (AFM copy)", o("afm_benchmarks", "webwalker_main.json"))])
    check_disjoint()


def check_disjoint() -> None:
    """No train-pool id or normalized question appears in any shipped eval file."""
    from coa_lab.tasks.suites import SUITE_FILES

    files = {split: [HERE / f for s in SUITE_FILES.values() for f in s[split].values()] for split in ("train", "eval")}
    train = [t for f in files["train"] for t in load_tasks(f)]
    ids, qs = {t.id for t in train}, {normalize_answer(t.question) for t in train}
    for f in files["eval"]:
        clash = [t.id for t in load_tasks(f) if t.id in ids or normalize_answer(t.question) in qs]
        if clash:
            raise SystemExit(f"{f}: train/eval overlap {clash[:5]}")
    print("train pools disjoint from every eval file")


if __name__ == "__main__":
    main()
