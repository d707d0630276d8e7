"""What the policy gradient needs: its effect over the SFT-only control at several rollout budgets.

Run:  python -m benchmarks.rl_budget_table LABEL=ARMS_JSON [LABEL=ARMS_JSON ...] [--name rl_budget] [--publish]

Each ARMS_JSON is a `bench_rl_seeds.py --arms rl+ptx control` result (runs/bench/<name>.json) from
the SAME SFT adapter, pool screening and evaluation tasks, at one rollout budget (e.g.
`--set rl.group_size=8` for twice the rollouts of cpu-tiny's 4); LABEL names the budget ("1x", "2x").
For every budget and every seed both arms ran: rl+ptx − control (paired over tasks, with its
standard error and the tasks won and lost), the rollouts sampled and where the run's time went
(sampling vs update), and across seeds the mean with its bootstrap interval over seeds and tasks
(docs/results/rl_budget.json was written when it resampled the tasks alone). The control arm
samples nothing, so one control run serves every budget of the same seed (its scores may be
copied between the benchmarks' scores folders; the file says so in `control_shared`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from coa_lab.comparison import bootstrap_seeds_tasks, paired


def budget_row(label: str, arms: dict) -> dict:
    tasks = arms["task_ids"]
    outcomes = {a: {int(s): dict(zip(tasks, o)) for s, o in v["outcomes"].items()} for a, v in arms["arms"].items()}
    if "rl+ptx" not in outcomes or "control" not in outcomes:
        raise SystemExit(f"{label}: the arms file needs both rl+ptx and control")
    seeds = sorted(set(outcomes["rl+ptx"]) & set(outcomes["control"]))
    per = [paired(outcomes["control"][s], outcomes["rl+ptx"][s]) for s in seeds]
    boot = bootstrap_seeds_tasks([(outcomes["control"][s], outcomes["rl+ptx"][s]) for s in seeds])
    rl = arms["arms"]["rl+ptx"]
    at = {s: i for i, s in enumerate(rl["seeds"])}
    return {"budget": label, "group_size_override": [o for o in arms.get("overrides", []) if "group_size" in o],
            "seeds": seeds, "split": arms["split"], "tasks": arms["tasks"],
            "rl_ptx_minus_control": [p["gain"] for p in per], "paired_se": [p["se"] for p in per],
            "won": [p["won"] for p in per], "lost": [p["lost"] for p in per],
            "mean": boot["mean"], "ci95": boot["ci95"],
            "rollouts": [rl["rollouts"][at[s]] for s in seeds],
            "sample_seconds": [rl["sample_seconds"][at[s]] for s in seeds],
            "update_seconds": [rl["update_seconds"][at[s]] for s in seeds],
            "rl_ptx_accuracy": [rl["accuracy"][at[s]] for s in seeds]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("budgets", nargs="+", metavar="LABEL=ARMS_JSON")
    ap.add_argument("--name", default="rl_budget")
    ap.add_argument("--note", default="")
    ap.add_argument("--publish", action="store_true", help="write docs/results/<name>.json")
    args = ap.parse_args(argv)
    rows = []
    for item in args.budgets:
        label, _, path = item.partition("=")
        rows.append(budget_row(label, json.loads(Path(path).read_text())))
    if len({r["tasks"] for r in rows}) != 1 or len({r["split"] for r in rows}) != 1:
        raise SystemExit("every budget must be read on the same split and tasks")
    result = {"budgets": rows, "units": "fractions of the tasks (x100: points)", "control_shared": True,
              "note": args.note}
    for r in rows:
        print(f"{r['budget']}: rl+ptx - control per seed "
              + ", ".join(f"{100 * g:+.1f} ± {100 * se:.1f}" for g, se in zip(r["rl_ptx_minus_control"], r["paired_se"]))
              + f"; mean {100 * r['mean']:+.1f} [{100 * r['ci95'][0]:+.1f}, {100 * r['ci95'][1]:+.1f}]; rollouts "
              f"{r['rollouts']}, sampling {r['sample_seconds']} s, update {r['update_seconds']} s")
    if args.publish:
        from coa_lab.machine import machine_peak
        from coa_lab.published import publish

        source = "python -m benchmarks.rl_budget_table " + " ".join(args.budgets)
        print(publish(args.name, result, source, machine_peak()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
