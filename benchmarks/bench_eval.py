"""Benchmark evaluation of one system: every readout in one pass vs a pass per readout.

Run:  python -m benchmarks.bench_eval [--adapter DIR] [--repeats 1] [--scale 1.0]
Writes runs/bench/eval.json (under COA_LAB_RUNS if set; benchmarks/results.py).

What the demo's evaluation reads of each adapter (cpu-tiny's eval: greedy on the test mix and
on the validation mix, and eval.control_samples samples at rl.temperature on the headline tasks),
rolled out by the same policy (default: the demo's SFT adapter when `make demo` has written
it), two ways, alternating in one run:
  1. one pass (`evaluate_readouts`, what pipeline._evaluate_system does): the union of the three
     readouts' rows, each at its own temperature; a task's greedy and sampled rows share one
     prompt, prefilled once;
  2. a pass per readout (what evaluation did before: `evaluate` three times).
Reported: seconds both ways, their ratio, and how many greedy final answers agree (greedy both
ways; under bf16 batch composition can flip a near-tie token: exact equality is for fp32,
COA_LAB_CPU_BF16=0). The sampled rows draw differently in a mixed batch and are not compared.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks.results import demo_adapter, save  # noqa: E402

from coa_lab import protocol  # noqa: E402
from coa_lab.config import get_preset  # noqa: E402
from coa_lab.evaluate import Readout, evaluate, evaluate_readouts  # noqa: E402
from coa_lab.generation.llm import make_generator  # noqa: E402
from coa_lab.machine import machine_peak  # noqa: E402
from coa_lab.pipeline import by_benchmark, draw_tasks, make_tools  # noqa: E402


def readouts_of(preset, scale: float) -> dict[str, Readout]:
    """The demo's three readouts of one adapter, each mix scaled by `scale` (at least 1 task a key)."""
    tiny = get_preset("cpu-tiny").eval
    mix = {k: max(1, round(v * scale)) for k, v in tiny.tasks.items()}
    val_mix = {k: max(1, round(v * scale)) for k, v in tiny.val_tasks.items()}
    test = by_benchmark(draw_tasks(preset, mix, "test"), mix)
    val = by_benchmark(draw_tasks(preset, val_mix, "val"), val_mix)
    headline = {key: test[key] for key in tiny.headline if key in test}
    greedy_t = preset.eval.temperature
    return {"test": Readout(test, 1, greedy_t), "val": Readout(val, 1, greedy_t),
            "sampled": Readout(headline, tiny.control_samples, preset.rl.temperature)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adapter", type=Path, default=None)
    ap.add_argument("--preset", default="cpu-tiny")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the demo's eval mixes (smoke tests)")
    args = ap.parse_args()
    preset = get_preset(args.preset)
    readouts = readouts_of(preset, args.scale)
    tools = make_tools(preset)
    adapter = demo_adapter(args.adapter)
    generator = make_generator(preset, adapter)
    rows = {name: sum(len(ts) for ts in r.tasks_by_suite.values()) * r.samples for name, r in readouts.items()}
    print(f"rows per readout {rows}, adapter {adapter or '(none: base model)'}, batch {preset.gen.batch_size}")

    def one_pass():
        return evaluate_readouts(generator, readouts, tools, preset)

    def per_readout():
        return {name: evaluate(generator, r.tasks_by_suite, tools, preset, label=name, samples=r.samples,
                               temperature=r.temperature) for name, r in readouts.items()}

    seconds: dict[str, list[float]] = {"one_pass": [], "per_readout": []}
    greedy: dict[str, list] = {}
    for _ in range(args.repeats):
        for name, fn in (("one_pass", one_pass), ("per_readout", per_readout)):
            t0 = time.perf_counter()
            results = fn()
            seconds[name].append(time.perf_counter() - t0)
            greedy[name] = [protocol.final_answer(rec.text) for label in ("test", "val") for rec in results[label].records]
            print(f"  {name:11s}: {seconds[name][-1]:7.1f} s")
    best = {k: min(v) for k, v in seconds.items()}
    same = sum(a == b for a, b in zip(greedy["one_pass"], greedy["per_readout"]))
    result = {
        "rows": rows, "adapter": "the demo's SFT adapter" if adapter and args.adapter is None else (str(adapter) if adapter else None),
        "one_pass_seconds": round(best["one_pass"], 1), "per_readout_seconds": round(best["per_readout"], 1),
        "speedup": round(best["per_readout"] / best["one_pass"], 2),
        "same_greedy_answers": f"{same}/{len(greedy['one_pass'])}", "machine": machine_peak(preset),
    }
    print(f"evaluation of one adapter: {result['one_pass_seconds']} s in one pass, {result['per_readout_seconds']} s "
          f"a pass per readout ({result['speedup']}x); same greedy answers {result['same_greedy_answers']}")
    save("eval", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
