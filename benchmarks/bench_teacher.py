"""Benchmark the teacher's capture: shared-prefix prefill vs plain prefill, in one run.

Run:  python -m benchmarks.bench_teacher [--arith 24] [--lookup 8]
Writes runs/bench/teacher.json (under COA_LAB_RUNS if set; benchmarks/results.py).

Every agent of the multi-agent teacher re-reads its instruction and two worked examples
(~400 tokens) before a ~20-token task; the decoder prefills each shared prefix once per group
of prompts (coa_lab.generation.decoding.shared_prefix_groups: cut by cost). Measured here on the same
model, tasks and batch, greedy, both ways:
  1. shared-prefix groups (what capture uses);
  2. plain prefill (groups disabled: every prompt prefilled whole, left-padded).
The runs must give the same final answers (the cache rows are exact copies); the ratio of
their seconds is the figure that carries over between machines.
"""

from __future__ import annotations

import argparse
import sys
import time


from benchmarks.results import save  # noqa: E402

from coa_lab.capture.teacher import run_teacher  # noqa: E402
from coa_lab.config import get_preset  # noqa: E402
from coa_lab.evaluate import teacher_eval  # noqa: E402
from coa_lab.generation import decoding  # noqa: E402
from coa_lab.generation.llm import make_generator  # noqa: E402
from coa_lab.pipeline import draw_tasks, make_tools  # noqa: E402
from coa_lab.machine import machine_peak  # noqa: E402


def timed_capture(backend, tasks, tools, preset) -> tuple[float, list]:
    t0 = time.perf_counter()
    runs = run_teacher(backend, tasks, tools, preset.capture, preset.gen.observation_chars)
    return time.perf_counter() - t0, runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arith", type=int, default=24)
    ap.add_argument("--lookup", type=int, default=8)
    ap.add_argument("--preset", default="cpu-tiny")
    args = ap.parse_args()
    preset = get_preset(args.preset)
    tasks = draw_tasks(preset, {"math/arith": args.arith, "mhqa/lookup": args.lookup}, "train")
    tools = make_tools(preset)
    backend = make_generator(preset)
    print(f"{len(tasks)} capture tasks ({args.arith} arith + {args.lookup} look-ups), batch {preset.gen.batch_size}, "
          f"{preset.capture.few_shot} worked examples per agent")

    shared_s, shared = timed_capture(backend, tasks, tools, preset)
    print(f"  shared-prefix groups: {shared_s:7.1f} s")
    saved = decoding.MIN_SHARED_PREFIX
    decoding.MIN_SHARED_PREFIX = 10**9  # no common prefix is that long: every prompt prefilled whole
    try:
        plain_s, plain = timed_capture(backend, tasks, tools, preset)
    finally:
        decoding.MIN_SHARED_PREFIX = saved
    print(f"  plain prefill       : {plain_s:7.1f} s")

    same = sum(a.final_answer == b.final_answer for a, b in zip(shared, plain))
    prompt_tokens = sum(a.prompt_tokens for r in shared for a in r.activations)
    result = {
        "tasks": len(tasks), "agent_calls": sum(len(r.activations) for r in shared),
        "prompt_tokens": prompt_tokens,
        "shared_prefix_seconds": round(shared_s, 1), "plain_prefill_seconds": round(plain_s, 1),
        "speedup": round(plain_s / shared_s, 2), "same_final_answers": f"{same}/{len(tasks)}",
        "teacher_accuracy": round(teacher_eval(shared)["all"]["accuracy"], 3),
        "machine": machine_peak(preset),
    }
    print(f"speed-up of shared-prefix prefill: {result['speedup']}x; same final answers {result['same_final_answers']}; "
          f"teacher accuracy {result['teacher_accuracy']}")
    save("teacher", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
