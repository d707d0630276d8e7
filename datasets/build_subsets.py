"""Build the shipped GSM8K task files and the teacher-trajectory subsets.

Documents how ``datasets/math/gsm8k/*.jsonl`` and ``datasets/trajectories/*.jsonl`` were
made.  Reads the read-only source checkout (``/work/shared/datasets``); not used at run time.
Run AFTER build_corpus.py (the trajectory filters read the shipped eval sets; the R1-Searcher
sample reads every eval file, so on a fresh build run this again after build_eval_sets.py):

    PYTHONPATH=. python datasets/build_subsets.py

Choices:
- GSM8K train pool = first 500 rows of GSM8K train; eval = first 200 rows of GSM8K test
  (GSM8K files are not sorted by difficulty or topic, so "first N" is a fair sample).
- Trajectories are copied byte-for-byte (raw teacher layouts, so the importers in
  coa_lab.distill.importers run on real data), seeded random samples of 60 rows whose
  question is not in ANY shipped eval set.  ToRA rows are ToRA-70B runs on GSM8K *test*
  questions; excluding our 200 eval questions keeps evaluation clean, but note they are
  still test-split questions of GSM8K (outside our eval subset).
- R1-Searcher rows are its Qwen model's runs on 500 HotpotQA *dev* questions, the same pool
  our HotpotQA eval set is drawn from, so the sample excludes the questions of every shipped
  eval file (every ``eval.jsonl`` and every eval parquet, read by the lab's own loader).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from build_corpus import HERE, origin, read_jsonl, shipped_entry, write_jsonl, write_source

from coa_lab.tasks.loaders import load_tasks
from coa_lab.tasks.scorers import math_equal, normalize_answer
from coa_lab.tasks.suites import SUITE_FILES

GSM8K_TRAIN_ROWS = 500
GSM8K_EVAL_ROWS = 200
TRAJECTORY_ROWS = 60
# FireAct's yes/no ("comparison") runs are ~8% of its HotpotQA file; a plain sample of 60 drew
# none, and a model never shown a yes/no answer gets no RL signal from HotpotQA's yes/no
# questions. So up to this many of them are added on top of the random sample.
FIREACT_YES_NO_ROWS = 20
SEED = 0
SHARED = Path("/work/shared/datasets")
R1SEARCHER_ROWS = 40


def gsm8k_task(row: dict, split: str, index: int) -> dict:
    rationale, _, final = row["answer"].rpartition("####")
    return {
        "id": f"gsm8k-{split}-{index}",  # same index ToRA calls "idx" for the test split
        "question": row["question"],
        "answers": [final.strip()],
        "source": "gsm8k",
        "profile": "math",
        "metadata": {"origin": f"gsm8k/{split}.jsonl", "origin_row": index, "solution": rationale.strip()},
    }


def build_gsm8k() -> list[dict]:
    out = HERE / "math/gsm8k"
    train = [gsm8k_task(r, "train", i) for i, r in enumerate(read_jsonl(SHARED / "math/gsm8k/train.jsonl"))]
    test = [gsm8k_task(r, "test", i) for i, r in enumerate(read_jsonl(SHARED / "math/gsm8k/test.jsonl"))]
    train, eval_rows = train[:GSM8K_TRAIN_ROWS], test[:GSM8K_EVAL_ROWS]
    write_jsonl(out / "train.jsonl", train)
    write_jsonl(out / "eval.jsonl", eval_rows)
    layout = "coa_lab Task layout; answers = text after '####'; metadata.solution = GSM8K rationale (with <<calc>> annotations)"
    write_source(out, [
        shipped_entry(out / "train.jsonl", len(train), f"first {GSM8K_TRAIN_ROWS} rows of GSM8K train",
                      [origin(SHARED, "math/gsm8k", "train.jsonl")], layout),
        shipped_entry(out / "eval.jsonl", len(eval_rows), f"first {GSM8K_EVAL_ROWS} rows of GSM8K test",
                      [origin(SHARED, "math/gsm8k", "test.jsonl")], layout),
    ])
    return eval_rows


def eval_questions() -> set[str]:
    qs = set()
    for path in (HERE / "math/gsm8k/eval.jsonl", HERE / "mhqa/hotpotqa/eval.jsonl"):
        qs |= {normalize_answer(r["question"]) for r in read_jsonl(path)}
    return qs


def sample_raw_lines(path: Path, question_of, banned: set[str], keep=lambda row: True,
                     n: int = TRAJECTORY_ROWS) -> list[str]:
    """Seeded sample of raw lines whose question is not banned (kept verbatim)."""
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    ok = [ln for ln in lines if keep(json.loads(ln)) and normalize_answer(question_of(json.loads(ln))) not in banned]
    picked = sorted(random.Random(SEED).sample(range(len(ok)), min(n, len(ok))))
    return [ok[i] for i in picked]


def fireact_yes_no(row: dict) -> bool:
    return any(re.search(r"finish\[(yes|no)\]", m.get("content") or "", re.I) for m in row["messages"])


def build_trajectories() -> None:
    banned = eval_questions()
    out = HERE / "trajectories"
    out.mkdir(parents=True, exist_ok=True)
    fireact_src = SHARED / "trajectories/fireact_sft_trajectories/hotpotqa.jsonl"
    question = lambda r: r["messages"][0]["content"]  # noqa: E731
    fireact = sample_raw_lines(fireact_src, question, banned)
    fireact += [ln for ln in sample_raw_lines(fireact_src, question, banned, keep=fireact_yes_no, n=FIREACT_YES_NO_ROWS)
                if ln not in fireact]
    tora_src = SHARED / "trajectories/tora_tool_integrated_trajs/tora70b_gsm8k_test.jsonl"
    tora = sample_raw_lines(tora_src, lambda r: r["question"], banned)
    (out / "fireact_hotpotqa_react.jsonl").write_text("\n".join(fireact) + "\n", encoding="utf-8")
    (out / "tora70b_gsm8k.jsonl").write_text("\n".join(tora) + "\n", encoding="utf-8")
    n_wrong = sum(1 for ln in tora if not math_equal(json.loads(ln)["pred"][0], json.loads(ln)["gt"]))
    write_source(out, [
        shipped_entry(out / "fireact_hotpotqa_react.jsonl", len(fireact),
                      f"random.Random({SEED}).sample of {TRAJECTORY_ROWS} rows among those whose question is not in a shipped eval set, plus a sample of {FIREACT_YES_NO_ROWS} yes/no (finish[yes|no]) rows; lines copied verbatim",
                      [origin(SHARED, "trajectories/fireact_sft_trajectories", "hotpotqa.jsonl")],
                      "GPT-4 ReAct runs on HotpotQA (OpenAI 'messages'; Thought/Action search[]/finish[]; every row ends with reward = True)"),
        shipped_entry(out / "tora70b_gsm8k.jsonl", len(tora),
                      f"random.Random({SEED}).sample of {TRAJECTORY_ROWS} rows whose question is not in a shipped eval set (i.e. GSM8K test idx >= {GSM8K_EVAL_ROWS}); lines copied verbatim",
                      [origin(SHARED, "trajectories/tora_tool_integrated_trajs", "tora70b_gsm8k_test.jsonl")],
                      f"ToRA-70B greedy tool-integrated runs; {n_wrong} of {len(tora)} are wrong by math_equal(pred, gt) (kept on purpose: the outcome filter needs failures to remove)"),
    ])
    print(f"trajectories fireact={len(fireact)} tora={len(tora)} (tora wrong={n_wrong})")


def all_eval_questions() -> set[str]:
    """Normalized questions of every shipped held-out file (validation and test): the suites' eval files (jsonl and
    parquet) plus any other ``eval.jsonl``, so a file added outside the suites still counts."""
    paths = {HERE / rel for splits in SUITE_FILES.values() for split in ("val", "test")
             for rel in splits.get(split, {}).values()}
    paths |= set(HERE.rglob("eval.jsonl")) | set(HERE.rglob("val.jsonl")) | set(HERE.rglob("test.jsonl"))
    return {normalize_answer(t.question) for path in sorted(paths) for t in load_tasks(path)}


def build_r1searcher() -> None:
    """R1-Searcher (Qwen) HotpotQA runs: a seeded sample, eval questions excluded, verbatim."""
    out = HERE / "trajectories"
    name = "r1searcher_hotpotqa_qwen.jsonl"
    src = SHARED / "trajectories/r1searcher_trajectories/hotpotqa_qwen.jsonl"
    banned = all_eval_questions()
    n_src = sum(1 for ln in src.read_text(encoding="utf-8").splitlines() if ln.strip())
    rows = sample_raw_lines(src, lambda r: r["question"], banned, n=R1SEARCHER_ROWS)
    (out / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    n_right = sum(1 for ln in rows if str(json.loads(ln)["gpt4o_output"]).strip() == "True")
    entries = [e for e in json.loads((out / "SOURCE.json").read_text(encoding="utf-8")) if e["file"] != name]
    entries.append(shipped_entry(
        out / name, len(rows),
        f"random.Random({SEED}).sample of {R1SEARCHER_ROWS} of the {n_src} rows, among those whose normalized question is in no shipped eval file (every eval.jsonl and eval parquet); lines copied verbatim",
        [origin(SHARED, "trajectories/r1searcher_trajectories", "hotpotqa_qwen.jsonl")],
        f"runs of R1-Searcher's RL-trained Qwen model (per the file name) on HotpotQA dev questions: <|begin_of_query|> search calls, <|begin_of_documents|> results, </think> then <answer>; {n_right} of {len(rows)} judged correct by GPT-4o (gpt4o_output), the rest kept for the outcome filter"))
    write_source(out, entries)
    print(f"trajectories r1searcher={len(rows)} (judged correct={n_right}, eval questions excluded={len(banned)})")


def main() -> None:
    eval_rows = build_gsm8k()
    print(f"gsm8k train={GSM8K_TRAIN_ROWS} eval={len(eval_rows)}")
    build_trajectories()
    build_r1searcher()  # after build_trajectories, which rewrites SOURCE.json


if __name__ == "__main__":
    main()
