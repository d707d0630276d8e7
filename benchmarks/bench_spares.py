"""RL's sampling half with and without spares (rl.spare_groups, rl/rollouts.collect_batch), in one run.

Run:  python -m benchmarks.bench_spares [--steps 3] [--repeats 1] [--spares 2] [--preset cpu-quick]
Writes runs/bench/spares.json (under COA_LAB_RUNS if set).

Dynamic sampling refills the groups its first round left without a reward spread with a second
round: a second decode pass, as long as its longest rollout, for one or two questions. Spares sample
that round's questions in the first round's pass. Here `collect_batch` runs `--steps` RL steps' worth
of sampling (no update between them: one fixed policy, the demo's SFT adapter when `make demo` wrote
it) on the demo's screened pool and anchors (runs/demo/rl/pool.json; else every candidate of the
preset's pool, and those as anchors too), once with `rl.spare_groups` 0 and once with `--spares`,
alternating `--repeats` times, each arm from the same task streams. Per arm: seconds a step, decode
passes and rounds a step, rollouts sampled (spares included) and kept groups; `speedup` = seconds
without spares / with. The two arms' samples differ (the same policy, other random draws), so which
steps run short differs too; tests/rl/test_rl_spares.py checks, with a scripted policy, that spares
change no round's questions or groups.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

import torch

from benchmarks.results import demo_adapter, save  # noqa: E402

from coa_lab.config import get_preset  # noqa: E402
from coa_lab.machine import machine_peak  # noqa: E402
from coa_lab.paths import runs_dir  # noqa: E402
from coa_lab.pipeline import draw_tasks, make_generator, make_tools  # noqa: E402
from coa_lab.rl.checkpoint import TaskCycle  # noqa: E402
from coa_lab.rl.pool import anchor_stream  # noqa: E402
from coa_lab.rl.rollouts import collect_batch  # noqa: E402


def pool_and_anchors(preset) -> tuple[list, list, str]:
    """The demo's screened pool and anchors, else every candidate as both."""
    candidates = draw_tasks(preset, preset.rl.pool, "train", skip=preset.capture.tasks)
    saved = runs_dir() / "demo" / "rl" / "pool.json"
    if saved.exists():
        screened = json.loads(saved.read_text())
        pool = [t for t in candidates if t.id in set(screened["pool"])]
        anchors = [t for t in candidates if t.id in set(screened["anchors"])]
        if len(pool) >= preset.rl.prompts_per_step and anchors:
            return pool, anchors, "the demo's screened pool (runs/demo/rl/pool.json)"
    return candidates, candidates, "every candidate of the preset's pool (no demo screening found)"


def run_arm(generator, tools, preset, pool, anchors, steps: int, seed: int) -> dict:
    """`steps` steps of collect_batch from fresh task streams seeded by `seed`; per-step counts summed."""
    torch.manual_seed(seed)
    pool_iter = TaskCycle(pool, rng=random.Random(seed))
    anchor_iter = anchor_stream(anchors, seed) if preset.rl.anchors_per_step else None
    out = {"seconds": 0.0, "passes": 0, "rounds": 0, "sampled_rollouts": 0, "kept_groups": 0,
           "spare_groups_unused": 0}
    for _ in range(steps):
        t0 = time.perf_counter()
        groups, _, stats = collect_batch(generator, pool_iter, tools, preset, anchor_iter)
        out["seconds"] += time.perf_counter() - t0
        out["kept_groups"] += len(groups)
        unused = stats["spare_groups_unused"] * preset.rl.group_size
        out["sampled_rollouts"] += stats["sampled_rollouts"] + unused  # every rollout decoded
        for key in ("passes", "rounds", "spare_groups_unused"):
            out[key] += stats[key]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--spares", type=int, default=2)
    ap.add_argument("--preset", default="cpu-quick")
    args = ap.parse_args()
    base = get_preset(args.preset)
    adapter = demo_adapter(None)
    pool, anchors, source = pool_and_anchors(base)
    generator, tools = make_generator(base, adapter), make_tools(base)
    machine = machine_peak(base)
    print(f"{len(pool)} pool questions, {len(anchors)} anchors from {source}; {args.steps} steps an arm")
    arms: dict[str, list[dict]] = {"without": [], "with": []}
    for r in range(max(1, args.repeats)):
        for name, spares in (("without", 0), ("with", args.spares)):
            # at least one refill round, so the spares have one to stand in for (cpu-smoke has none)
            preset = get_preset(args.preset, rl={"spare_groups": spares,
                                                 "max_sampling_rounds": max(1, base.rl.max_sampling_rounds)})
            arm = run_arm(generator, tools, preset, pool, anchors, args.steps, base.seed + r)
            arms[name].append(arm)
            print(f"  {name} spares: {arm['seconds'] / args.steps:.1f} s a step, {arm['passes']} passes, "
                  f"{arm['rounds']} rounds, {arm['sampled_rollouts']} rollouts", flush=True)

    def per_step(name: str) -> dict:
        n = args.steps * len(arms[name])
        total = {k: sum(a[k] for a in arms[name]) for k in arms[name][0]}
        return {k: round(v / n, 2) for k, v in total.items()}

    result = {"pool_source": source, "pool": len(pool), "anchors": len(anchors), "steps": args.steps,
              "repeats": len(arms["with"]), "spare_groups": args.spares, "adapter": "the demo's SFT adapter" if adapter else None,
              "per_step": {name: per_step(name) for name in arms},
              "machine": {"start": machine, "end": machine_peak(base)}}
    result["speedup"] = round(result["per_step"]["without"]["seconds"] / result["per_step"]["with"]["seconds"], 2)
    w, wo = result["per_step"]["with"], result["per_step"]["without"]
    print(f"a step's sampling: {wo['seconds']} s without spares ({wo['passes']} passes), {w['seconds']} s with "
          f"{args.spares} ({w['passes']} passes): x{result['speedup']}")
    save("spares", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
