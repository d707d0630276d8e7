"""Could the demo train its SFT student for fewer epochs? The same kept trajectories, SFT for N
epochs each, every adapter scored on the same VALIDATION tasks (paired, greedy).

Run:  python -m benchmarks.probe_sft_epochs [--run runs/demo] [--epochs 5 3]
      [--adapter 5=runs/demo/sft/adapter] [--arith 96 --lookup 32]
Writes runs/bench/NAME.json (--name, default sft_epochs; under COA_LAB_RUNS if set). A diagnostic
for a demo-size decision (the demo's time target), not part of `make bench`.

SFT is the demo's largest stage after RL (5 epochs over 57 trajectories: ~9 of its 40 minutes
on a 2-core AVX2 draw), and its time is its epochs: the step already runs near the machine's
matmul probe (packed rows, the LM head only on labelled columns). So the one way to shorten it
is to train less. Each arm trains from RUN/distill/kept.jsonl with RUN's recorded preset and only
`sft.epochs` changed (the learning-rate schedule then decays over that arm's own steps), unless
`--adapter EPOCHS=DIR` names an adapter already trained that way (the demo's own: the recipe's 5).
Per arm: accuracy and format validity per family, seconds to train; against the first arm, the
tasks both solve, only the first, only this one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path


from benchmarks.results import save  # noqa: E402

from coa_lab import pipeline  # noqa: E402
from coa_lab.config import preset_from_dict  # noqa: E402
from coa_lab.machine import machine_peak  # noqa: E402
from coa_lab.paths import runs_dir  # noqa: E402


def train(preset, run: Path, epochs: float, out: Path) -> tuple[Path, dict]:
    """SFT for `epochs` on RUN's kept trajectories into OUT (a run folder of its own)."""
    import dataclasses

    shutil.rmtree(out, ignore_errors=True)
    (out / "distill").mkdir(parents=True)
    shutil.copy(run / "distill" / "kept.jsonl", out / "distill" / "kept.jsonl")
    arm = dataclasses.replace(preset, sft=dataclasses.replace(preset.sft, epochs=epochs))
    summary = pipeline.sft(arm, out)
    return out / "sft" / "adapter", summary


def score(preset, adapter: Path, groups: dict, tools) -> tuple[dict, dict]:
    """(per family {accuracy, format_valid, tasks}, per task 1/0) of a greedy pass."""
    from coa_lab.evaluate import evaluate
    from coa_lab.generation.llm import make_generator

    result = evaluate(make_generator(preset, adapter), groups, tools, preset, label=adapter.name)
    families = {k: {"accuracy": s.accuracy, "format_valid": s.format_valid, "tasks": s.tasks}
                for k, s in result.suites.items()}
    return families, {r.task_id: 1 if (r.reward or 0) >= 1 else 0 for r in result.records}


def paired(first: dict[str, int], other: dict[str, int]) -> dict[str, int]:
    """Tasks solved by both arms, by the first only, by the other only (the same task ids)."""
    if set(first) != set(other):
        raise ValueError("the arms were scored on different tasks")
    return {"both": sum(1 for t in first if first[t] and other[t]),
            "first_only": sum(1 for t in first if first[t] and not other[t]),
            "other_only": sum(1 for t in first if other[t] and not first[t])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, default=Path("runs/demo"), help="a run folder with distill/kept.jsonl")
    ap.add_argument("--epochs", type=float, nargs="+", default=[5.0, 3.0])
    ap.add_argument("--adapter", action="append", default=[], metavar="EPOCHS=DIR",
                    help="an adapter already trained for EPOCHS on RUN's trajectories (not retrained)")
    ap.add_argument("--arith", type=int, default=96)
    ap.add_argument("--lookup", type=int, default=32)
    ap.add_argument("--name", default="sft_epochs")
    args = ap.parse_args(argv)
    saved = args.run / "preset.json"
    if not (args.run / "distill" / "kept.jsonl").exists() or not saved.exists():
        raise SystemExit(f"{args.run} has no distill/kept.jsonl and preset.json: run `coa-lab demo` (or capture + distill) first")
    preset = preset_from_dict(json.loads(saved.read_text()))
    given = {float(e): Path(d) for e, d in (a.split("=", 1) for a in args.adapter)}
    mix = {"math/arith": args.arith, "mhqa/lookup": args.lookup}
    groups = pipeline.by_benchmark(pipeline.draw_tasks(preset, mix, "val"), mix)
    tools = pipeline.make_tools(preset)
    out = {"run": str(args.run), "preset": preset.name, "split": "val", "val_mix": mix,
           "kept_trajectories": sum(1 for _ in open(args.run / "distill" / "kept.jsonl")),
           "machine_start": machine_peak(preset), "arms": []}
    first = None
    for epochs in args.epochs:
        arm: dict = {"epochs": epochs}
        if epochs in given:
            adapter, arm["adapter"] = given[epochs], f"given: {given[epochs]}"
        else:
            t0 = time.time()
            adapter, summary = train(preset, args.run, epochs, runs_dir() / "bench" / args.name / f"ep{epochs:g}")
            arm.update(train_seconds=round(time.time() - t0, 1), optimizer_steps=len(summary["losses"]),
                       last_loss=summary["last_loss"])
        t0 = time.time()
        arm["families"], per_task = score(preset, adapter, groups, tools)
        arm["eval_seconds"] = round(time.time() - t0, 1)
        arm["solved"] = sum(per_task.values())
        arm["tasks"] = len(per_task)
        if first is None:
            first = per_task
        else:
            arm["against_first"] = paired(first, per_task)
        out["arms"].append(arm)
        print(f"{epochs:g} epochs: {arm['solved']} of {arm['tasks']} validation tasks", flush=True)
    out["machine"] = machine_peak(preset)
    save(args.name, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
