"""Benchmark evaluation throughput: every suite in one rollout pass vs one pass per suite.

Run:  python -m benchmarks.bench_eval [--adapter DIR] [--repeats 1]
Writes runs/bench/eval.json (under COA_LAB_RUNS if set; benchmarks/results.py).

The demo's held-out mix (cpu-tiny's eval.tasks: 144 arithmetic, 48 look-ups, 4 GSM8K, 4 HotpotQA)
rolled out greedily by the same policy (default: the demo's SFT adapter when `make demo` has
written it), two ways, alternating in one run:
  1. one pass over all 200 tasks (what `evaluate` does: at most gen.batch_size rows at once,
     waiting prompts taking the slots finished rows free);
  2. one pass per suite (what it did before: 144, 48, 4 and 4 tasks).
A decode step reads every weight whatever the batch width, so the narrow passes cost nearly as
much per step as the wide one. Reported: tasks per minute both ways, their ratio, and how many
final answers agree (greedy both ways; batch composition can flip a near-tie token).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


from benchmarks.results import demo_adapter, save  # noqa: E402

from coa_lab import protocol  # noqa: E402
from coa_lab.student_rollout import run_coa  # noqa: E402
from coa_lab.config import get_preset  # noqa: E402
from coa_lab.generation.llm import make_generator  # noqa: E402
from coa_lab.pipeline import by_benchmark, draw_tasks, make_tools  # noqa: E402
from coa_lab.machine import machine_peak  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adapter", type=Path, default=None)
    ap.add_argument("--preset", default="cpu-tiny")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the demo's eval mix (smoke tests)")
    args = ap.parse_args()
    preset = get_preset(args.preset)
    mix = {k: max(1, round(v * args.scale)) for k, v in get_preset("cpu-tiny").eval.tasks.items()}
    groups = by_benchmark(draw_tasks(preset, mix, "eval"), mix)
    tasks = [t for ts in groups.values() for t in ts]
    tools = make_tools(preset)
    adapter = demo_adapter(args.adapter)
    generator = make_generator(preset, adapter)
    t = preset.eval.temperature
    print(f"{len(tasks)} tasks {mix}, adapter {adapter or '(none: base model)'}, batch {preset.gen.batch_size}")

    def one_pass():
        return run_coa(generator, tasks, tools, preset.gen, temperature=t)

    def per_suite():
        return [r for ts in groups.values() for r in run_coa(generator, ts, tools, preset.gen, temperature=t)]

    seconds = {"one_pass": [], "per_suite": []}
    answers = {}
    for _ in range(args.repeats):
        for name, fn in (("one_pass", one_pass), ("per_suite", per_suite)):
            t0 = time.perf_counter()
            rollouts = fn()
            seconds[name].append(time.perf_counter() - t0)
            answers[name] = [protocol.final_answer(r.text) for r in rollouts]
            print(f"  {name:9s}: {seconds[name][-1]:7.1f} s")
    best = {k: min(v) for k, v in seconds.items()}
    same = sum(a == b for a, b in zip(answers["one_pass"], answers["per_suite"]))
    result = {
        "tasks": len(tasks), "mix": mix, "adapter": str(adapter) if adapter else None,
        "one_pass_seconds": round(best["one_pass"], 1), "per_suite_seconds": round(best["per_suite"], 1),
        "one_pass_tasks_per_minute": round(60 * len(tasks) / best["one_pass"], 1),
        "per_suite_tasks_per_minute": round(60 * len(tasks) / best["per_suite"], 1),
        "speedup": round(best["per_suite"] / best["one_pass"], 2),
        "same_final_answers": f"{same}/{len(tasks)}", "machine": machine_peak(preset),
    }
    print(f"eval throughput: {result['one_pass_tasks_per_minute']} tasks/min in one pass, "
          f"{result['per_suite_tasks_per_minute']} per suite ({result['speedup']}x); same answers {same}/{len(tasks)}")
    save("eval", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
