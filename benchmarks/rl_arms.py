"""`bench_rl_seeds.py --arms`: what the policy gradient itself adds, against its control.

From ONE SFT adapter, with the same seeds, steps, pool and evaluation tasks, up to three arms:

- `control`: the SFT loss alone at the recipe's rows and rate (rl.pg_coef = 0: nothing sampled);
- `rl`: the policy gradient alone (rl.sft_coef = 0);
- `rl+ptx`: the recipe (both terms).

Every adapter is scored on the same tasks and its per-task outcomes kept, so each arm's gain over
SFT and `rl+ptx` − `control` are paired comparisons (coa_lab/comparison.py): per seed the gain, its
paired standard error and the tasks won and lost; over seeds the mean with a 95% bootstrap
interval over seeds and tasks (the rl_arms*.json under docs/results/ were written when it resampled the
tasks alone). Resumable: an (arm, seed) whose scores file exists is not run again.

`coa-lab arms` is this benchmark as a command, for any arms (--set-style overrides), with the
sampled readout (avg@K, pass@K at rl.temperature) beside greedy: coa_lab/rl_arms/.

Splits: `val` (eval.val_tasks: every decision is read here), `test` / `selection` (eval.tasks'
learnable families: the 192 tasks earlier benchmarks read), `confirm` (every task of the
confirmation split; only with --final, and each reading is appended to
docs/results/confirm_readings.jsonl with the commit, the date and what was read).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

from coa_lab.comparison import arms_table, task_scores
from coa_lab.rl.pool import headroom
from coa_lab.rl_arms.readout import eval_mix  # noqa: F401 - the split's tasks, shared with `coa-lab arms`
from coa_lab.rl_arms.runner import finished_rl  # noqa: F401 - a run whose RL stage ran all its steps

# each names its SFT mix, so an arm means what it meant whichever mix the preset's recipe has
ARMS = {"rl+ptx": {"sft_coef": 1.0}, "rl": {"sft_coef": 0.0}, "control": {"pg_coef": 0.0, "sft_coef": 1.0}}
ORDER = ("rl+ptx", "rl", "control")  # an RL arm first: its pool screening is reused by the others
READINGS = Path(__file__).resolve().parent.parent / "docs" / "results" / "confirm_readings.jsonl"


def arm_overrides(arm: str, overrides: dict, seed: int) -> dict:
    if arm not in ARMS:
        raise SystemExit(f"unknown arm {arm!r}; choose from {sorted(ARMS)}")
    rl = {**overrides.get("rl", {}), **ARMS[arm], "seed": seed}
    return {**overrides, "rl": rl}


def sft_mixing(arms) -> list[str]:
    """The arms that mix SFT rows into their updates (they read the adapter's SFT trajectories)."""
    for arm in arms:
        arm_overrides(arm, {}, 0)  # an unknown arm is refused before any work
    return [a for a in arms if ARMS[a].get("sft_coef", 0.0) > 0]


def record_reading(args, mix: dict, preset_name: str) -> None:
    """The confirmation split is read only for a final recipe, and every reading is on record."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=READINGS.parent).stdout.strip() or None
    except OSError:
        commit = None
    row = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": commit,
           "benchmark": "bench_rl_seeds.py --arms", "name": args.name, "preset": preset_name,
           "overrides": args.set, "arms": args.arms, "seeds": args.seeds, "tasks": mix}
    READINGS.parent.mkdir(parents=True, exist_ok=True)
    with READINGS.open("a") as fh:
        fh.write(json.dumps(row) + "\n")
    print(f"confirmation split read: recorded in {READINGS}")


def _scored(result, keys) -> dict:
    suites = [result.suites[k] for k in keys if k in result.suites]
    n = sum(s.tasks * s.samples for s in suites)
    return {"scores": task_scores(result.records, keys),
            "accuracy": sum(s.accuracy * s.tasks * s.samples for s in suites) / n,
            "format_valid": sum(s.format_valid * s.tasks * s.samples for s in suites) / n,
            "by_benchmark": {k: result.suites[k].accuracy for k in keys if k in result.suites}}


def _time_split(metrics: list[dict], group_size: int) -> dict:
    sample = sum(m.get("sample_seconds", 0.0) for m in metrics)
    total = sum(m.get("seconds", 0.0) for m in metrics)
    return {"sample_seconds": round(sample, 1), "update_seconds": round(total - sample, 1),
            "rollouts": sum(m.get("sampled_groups", 0) for m in metrics) * group_size,
            "optimizer_steps": sum(m.get("optimizer_steps", 0) for m in metrics)}


def run_arms(args, overrides: dict, base: Path, adapter: Path, kept: Path) -> int:
    from benchmarks.results import save

    from coa_lab import pipeline
    from coa_lab.config import get_preset
    from coa_lab.evaluate import evaluate
    from coa_lab.generation.llm import make_generator
    from coa_lab.machine import machine_peak

    preset = get_preset(args.preset, **overrides)  # the SFT set the mixing arms read: checked by bench_rl_seeds.main
    split = args.split
    if split == "confirm" and not args.final:
        raise SystemExit("the confirmation split is read only for a final recipe, and each reading is recorded: "
                         "pass --final to read it")
    keys = list(preset.eval.headline)
    mix = eval_mix(preset, split)
    load_split = {"selection": "test"}.get(split, split)
    groups = pipeline.by_benchmark(pipeline.draw_tasks(preset, mix, load_split), mix)
    tools = pipeline.make_tools(preset)
    machine_start = machine_peak(preset)
    scores_dir = base / "scores"
    scores_dir.mkdir(parents=True, exist_ok=True)
    if split == "confirm":
        record_reading(args, mix, args.preset)
    t0 = time.time()
    sft_file = scores_dir / "sft.json"
    if not sft_file.exists():
        t1 = time.time()
        sft = _scored(evaluate(make_generator(preset, adapter), groups, tools, preset, label="sft"), keys)
        sft["eval_seconds"] = round(time.time() - t1, 1)
        sft_file.write_text(json.dumps(sft))
    sft = json.loads(sft_file.read_text())
    print(f"SFT on {len(sft['scores'])} {split} tasks: accuracy {sft['accuracy']:.3f}")
    pool = base / "pool.json"
    if args.pool_from is not None and not pool.exists():
        shutil.copy(args.pool_from, pool)
    arms = [a for a in ORDER if a in args.arms]
    for seed in args.seeds:
        for arm in arms:
            out_file = scores_dir / f"{arm}_seed{seed}.json"
            if out_file.exists():
                continue
            seeded = get_preset(args.preset, **arm_overrides(arm, overrides, seed))
            run = base / arm / f"seed{seed}"
            summary = finished_rl(run, seeded) or _train_arm(seeded, run, adapter, kept, pool)
            t1 = time.time()
            scored = _scored(evaluate(make_generator(seeded, run / "rl" / "adapter"), groups, tools, seeded,
                                      label=arm), keys)
            metrics = summary["metrics"]
            scored.update({"seed": seed, "arm": arm, "rl_seconds": summary["seconds"],
                           "eval_seconds": round(time.time() - t1, 1),
                           **_time_split(metrics, seeded.rl.group_size),
                           "train_accuracy_by_step": [m.get("accuracy") for m in metrics],
                           "entropy_by_step": [m.get("entropy") for m in metrics],
                           "logprob_gap_by_step": [m.get("logprob_gap") for m in metrics]})
            out_file.write_text(json.dumps(scored))
            print(f"{arm} seed {seed}: accuracy {scored['accuracy']:.3f} (SFT {sft['accuracy']:.3f}), "
                  f"{scored['rollouts']} rollouts, sampling {scored['sample_seconds']} s, "
                  f"update {scored['update_seconds']} s")
            result = summarize(args, overrides, base, sft, mix, machine_start)
            result["machine"] = machine_peak(preset)
            result["seconds"] = round(time.time() - t0, 1)
            save(args.name, result)
    # written again from every scores file, also when nothing was left to run: arms or seeds whose
    # scores were copied in (a control shared between rollout budgets) join the result file
    result = summarize(args, overrides, base, sft, mix, machine_start)
    result["machine"] = machine_peak(preset)
    result["seconds"] = round(time.time() - t0, 1)
    save(args.name, result)
    print(json.dumps({a: {k: result["arms"][a][k] for k in ("gains", "mean_gain", "ci95")} for a in result["arms"]},
                     indent=1))
    if "rl_ptx_minus_control" in result:
        print("rl+ptx - control:", json.dumps(result["rl_ptx_minus_control"]))
    return 0


def _train_arm(seeded, run: Path, adapter: Path, kept: Path, pool: Path) -> dict:
    """One (arm, seed)'s RL stage from the SFT adapter, on the shared pool screening (the first run screens it)."""
    from coa_lab import pipeline

    shutil.rmtree(run, ignore_errors=True)
    (run / "sft").mkdir(parents=True)
    (run / "sft" / "adapter").symlink_to(adapter.resolve())
    if kept.exists():
        (run / "distill").symlink_to(kept.parent.resolve())
    if pool.exists():
        (run / "rl").mkdir()
        shutil.copy(pool, run / "rl" / "pool.json")
    summary = pipeline.rl(seeded, run, reuse_pool=pool.exists())
    if not pool.exists():  # the first screening: every later arm and seed trains on it
        shutil.copy(run / "rl" / "pool.json", pool)
    return summary


def summarize(args, overrides: dict, base: Path, sft: dict, mix: dict, machine_start: dict) -> dict:
    """The result file: every arm's per-seed figures, intervals, per-task outcomes, time split."""
    runs: dict[str, dict[int, dict]] = {}
    for f in sorted((base / "scores").glob("*_seed*.json")):
        d = json.loads(f.read_text())
        runs.setdefault(d["arm"], {})[d["seed"]] = d
    table = arms_table(sft["scores"], {a: {s: d["scores"] for s, d in by.items()} for a, by in runs.items()})
    tasks = sorted(sft["scores"])
    for arm, by in runs.items():
        seeds = sorted(by)
        table["arms"][arm].update({
            "format_valid": [by[s]["format_valid"] for s in seeds],
            "by_benchmark": [by[s]["by_benchmark"] for s in seeds],
            "rollouts": [by[s]["rollouts"] for s in seeds],
            "optimizer_steps": [by[s]["optimizer_steps"] for s in seeds],
            "sample_seconds": [by[s]["sample_seconds"] for s in seeds],
            "update_seconds": [by[s]["update_seconds"] for s in seeds],
            "eval_seconds": [by[s]["eval_seconds"] for s in seeds],
            "train_accuracy_by_step": [by[s]["train_accuracy_by_step"] for s in seeds],
            "entropy_by_step": [by[s]["entropy_by_step"] for s in seeds],
            "logprob_gap_by_step": [by[s]["logprob_gap_by_step"] for s in seeds],
            # per-task outcomes, in the order of `task_ids`: every claim above can be recomputed
            "outcomes": {str(s): [by[s]["scores"][t] for t in tasks] for s in seeds},
        })
    return {"preset": args.preset, "overrides": args.set, "split": args.split, "tasks": len(tasks), "mix": mix,
            "seeds": sorted({s for by in runs.values() for s in by}), "units": "fractions of the tasks (x100: points)",
            "sft": {"accuracy": sft["accuracy"], "format_valid": sft["format_valid"],
                    "by_benchmark": sft["by_benchmark"], "eval_seconds": sft.get("eval_seconds"),
                    "outcomes": [sft["scores"][t] for t in tasks]},
            **table, "task_ids": tasks, "machine_start": machine_start,
            "bf16_autocast": machine_start.get("bf16_autocast"),
            # the SFT policy's pass@1 and pass@k on the screened candidates: RL's headroom there
            "pool_headroom": headroom(json.loads((base / "pool.json").read_text())) if (base / "pool.json").exists() else None}
