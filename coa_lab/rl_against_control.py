"""RL against its control in one run: what the policy gradient added beyond more SFT.

The control (pipeline.control, eval.control) is the RL stage again with the policy gradient off: the
same SFT adapter, steps, SFT rows and seed, at the arms' control rate (eval.control_learning_rate).
Both are read on the same headline test tasks, greedy and k times at RL's sampling temperature (avg@k:
RL sharpens the sampled policy first, often under an unchanged greedy answer). Every figure here is a
coa_lab/comparison.py function of the eval stage's per-task files; nothing is recomputed from a model.

One run is one seed: the interval is a bootstrap over tasks (comparison.bootstrap_seeds_tasks with one
seed), and seeds vary more than that (`coa-lab arms` runs the same comparison across seeds, its interval
over seeds and tasks)."""

from __future__ import annotations

import json
from pathlib import Path

from coa_lab.comparison import load_task_scores, paired_block

PAIRS = (("rl", "control"), ("rl", "sft"), ("control", "sft"))  # (after, before): after − before


def _scores(eval_dir: Path, label: str, headline, sampled: bool) -> dict | None:
    path = eval_dir / (f"sampled_{label}_trajectories.jsonl" if sampled else f"{label}_trajectories.jsonl")
    return load_task_scores(path, headline) if path.exists() else None


def _block(before: dict, after: dict) -> dict:
    b = paired_block([(before, after)])
    return {"tasks": len(before), "before": b["before"][0], "after": b["after"][0], "gain": b["gains"][0],
            "se": b["paired_se"][0], "ci95": b["ci95"], "won": b["won"][0], "lost": b["lost"][0]}


def against_control(eval_dir: str | Path, headline) -> dict | None:
    """{"samples", "temperature", "rl_minus_control" / "rl_minus_sft" / "control_minus_sft": {"greedy",
    "avg_at_<k>": gain, paired SE, 95% interval over tasks, tasks won and lost}}; None without a control."""
    eval_dir = Path(eval_dir)
    summary = json.loads((eval_dir / "summary.json").read_text()) if (eval_dir / "summary.json").exists() else {}
    sampled = summary.get("sampled") or {}
    metrics = {"greedy": False, **({f"avg_at_{sampled['samples']}": True} if sampled.get("samples") else {})}
    out: dict = {"samples": sampled.get("samples", 0), "temperature": sampled.get("temperature")}
    for after, before in PAIRS:
        blocks = {}
        for metric, is_sampled in metrics.items():
            a, b = (_scores(eval_dir, label, headline, is_sampled) for label in (after, before))
            if a and b:
                blocks[metric] = _block(b, a)
        if blocks:
            out[f"{after}_minus_{before}"] = blocks
    return out if "rl_minus_control" in out else None


def _cell(block: dict | None) -> str:
    if block is None:
        return "–"
    lo, hi = (100 * x for x in block["ci95"])
    return f"{100 * block['gain']:+.1f} [{lo:+.1f}, {hi:+.1f}] ({block['won']} won / {block['lost']} lost)"


def control_lines(result: dict | None) -> list[str]:
    """The report's section: each comparison greedy and sampled, in points with its interval."""
    if not result:
        return []
    k, temp = result["samples"], result["temperature"]
    metrics = ["greedy"] + ([f"avg_at_{k}"] if k else [])
    names = {"rl_minus_control": "RL − control: what the policy gradient added",
             "rl_minus_sft": "RL − SFT: the policy gradient and more training together",
             "control_minus_sft": "control − SFT: more SFT alone"}
    head = "| comparison | greedy |" + (f" avg@{k} at T = {temp} |" if k else "")
    lines = ["## RL against its control", "",
             "The control is the RL stage again with the policy gradient off (the same steps, SFT rows and "
             "seed, at eval.control_learning_rate; nothing sampled). Points on the headline test tasks, one seed: "
             "95% interval over tasks, tasks won / lost (`coa-lab arms` runs the same comparison across seeds).", "",
             head, "|---|---|" + ("---|" if k else "")]
    for key, label in names.items():
        if key in result:
            lines.append(f"| {label} | " + " | ".join(_cell(result[key].get(m)) for m in metrics) + " |")
    return lines + [""]
