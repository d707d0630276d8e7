"""Build the shipped GSM8K task files and the teacher-trajectory subsets.

Documents how ``datasets/math/gsm8k/*.jsonl`` and ``datasets/trajectories/*.jsonl`` were
made.  Reads the read-only source checkout (``/work/shared/datasets``); not used at run time.
Run AFTER build_corpus.py (the trajectory filter reads the shipped HotpotQA eval set):

    PYTHONPATH=. python datasets/build_subsets.py

Choices:
- GSM8K train pool = first 500 rows of GSM8K train; eval = first 200 rows of GSM8K test
  (GSM8K files are not sorted by difficulty or topic, so "first N" is a fair sample).
- Trajectories are copied byte-for-byte (raw teacher layouts, so the importers in
  coa_lab.distill.importers run on real data), seeded random samples of 60 rows whose
  question is not in ANY shipped eval set.  ToRA rows are ToRA-70B runs on GSM8K *test*
  questions; excluding our 200 eval questions keeps evaluation clean, but note they are
  still test-split questions of GSM8K (outside our eval subset).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from build_corpus import HERE, origin, read_jsonl, shipped_entry, write_jsonl, write_source

from coa_lab.tasks.scorers import math_equal, normalize_answer

GSM8K_TRAIN_ROWS = 500
GSM8K_EVAL_ROWS = 200
TRAJECTORY_ROWS = 60
SEED = 0
SHARED = Path("/work/shared/datasets")


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


def sample_raw_lines(path: Path, question_of, banned: set[str], keep=lambda row: True) -> list[str]:
    """Seeded sample of raw lines whose question is not banned (kept verbatim)."""
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    ok = [ln for ln in lines if keep(json.loads(ln)) and normalize_answer(question_of(json.loads(ln))) not in banned]
    picked = sorted(random.Random(SEED).sample(range(len(ok)), TRAJECTORY_ROWS))
    return [ok[i] for i in picked]


def build_trajectories() -> None:
    banned = eval_questions()
    out = HERE / "trajectories"
    out.mkdir(parents=True, exist_ok=True)
    fireact_src = SHARED / "trajectories/fireact_sft_trajectories/hotpotqa.jsonl"
    fireact = sample_raw_lines(fireact_src, lambda r: r["messages"][0]["content"], banned)
    tora_src = SHARED / "trajectories/tora_tool_integrated_trajs/tora70b_gsm8k_test.jsonl"
    tora = sample_raw_lines(tora_src, lambda r: r["question"], banned)
    (out / "fireact_hotpotqa_react.jsonl").write_text("\n".join(fireact) + "\n", encoding="utf-8")
    (out / "tora70b_gsm8k.jsonl").write_text("\n".join(tora) + "\n", encoding="utf-8")
    n_wrong = sum(1 for ln in tora if not math_equal(json.loads(ln)["pred"][0], json.loads(ln)["gt"]))
    write_source(out, [
        shipped_entry(out / "fireact_hotpotqa_react.jsonl", len(fireact),
                      f"random.Random({SEED}).sample of {TRAJECTORY_ROWS} rows among those whose question is not in a shipped eval set; lines copied verbatim",
                      [origin(SHARED, "trajectories/fireact_sft_trajectories", "hotpotqa.jsonl")],
                      "GPT-4 ReAct runs on HotpotQA (OpenAI 'messages'; Thought/Action search[]/finish[]; every row ends with reward = True)"),
        shipped_entry(out / "tora70b_gsm8k.jsonl", len(tora),
                      f"random.Random({SEED}).sample of {TRAJECTORY_ROWS} rows whose question is not in a shipped eval set (i.e. GSM8K test idx >= {GSM8K_EVAL_ROWS}); lines copied verbatim",
                      [origin(SHARED, "trajectories/tora_tool_integrated_trajs", "tora70b_gsm8k_test.jsonl")],
                      f"ToRA-70B greedy tool-integrated runs; {n_wrong} of {len(tora)} are wrong by math_equal(pred, gt) (kept on purpose: the outcome filter needs failures to remove)"),
    ])
    print(f"trajectories fireact={len(fireact)} tora={len(tora)} (tora wrong={n_wrong})")


def main() -> None:
    eval_rows = build_gsm8k()
    print(f"gsm8k train={GSM8K_TRAIN_ROWS} eval={len(eval_rows)}")
    build_trajectories()


if __name__ == "__main__":
    main()
