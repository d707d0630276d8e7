"""How full the decoder's batches are during an evaluation pass, and what refilling them would save.

Run:  PYTHONPATH=. python benchmarks/bench_decode_occupancy.py [--adapter DIR] [--scale 1.0]
Writes runs/bench/decode_occupancy.json (under COA_LAB_RUNS if set; benchmarks/results.py).

The decoder (coa_lab/generation/decoding.py) splits a pass into equal chunks of at most
`gen.batch_size` rows and lets finished rows leave; a chunk ends with its longest rollout, so
its last steps run few rows. Continuous batching (vLLM's scheduler) would instead admit a waiting
prompt into every freed slot. Is it worth building here? This benchmark answers with one real
pass, greedy, the demo's test mix (default: the demo's SFT adapter when `make demo` wrote it):

  - measured: every one-token decode step's row count and duration (a forward pre-hook), the
    mean occupancy, the share of time spent in steps under 16 rows;
  - a step-time model t(rows) = a + b * rows, fitted (least squares) on the medians of the
    measured steps binned by row count (the binning and the median keep the steps that also ran
    a tool call from skewing the fit);
  - each rollout's lifetime in steps (its response tokens, sampled and forced, but the last), replayed through
    the decoder's own chunking -> `simulated_chunked` (checked against the measured steps and
    time), and through a continuous scheduler with `gen.batch_size` slots -> `simulated_continuous`.
`continuous_saving` = 1 - continuous / chunked, both simulated by the same model. Prefill is the
same work both ways (the same prompts) and is left out of both.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from results import demo_adapter, save  # noqa: E402 - benchmarks/results.py, beside this script

from coa_lab.agents.coa_runner import run_coa  # noqa: E402
from coa_lab.config import get_preset  # noqa: E402
from coa_lab.generation.llm import make_generator  # noqa: E402
from coa_lab.pipeline import by_benchmark, draw_tasks, machine_peak, make_tools  # noqa: E402


def fit_step_time(steps: list[tuple[int, float]], bin_rows: int = 4) -> tuple[float, float]:
    """(a, b) of t = a + b * rows, least squares over the per-bin medians of measured steps."""
    import statistics

    bins: dict[int, list[float]] = {}
    for rows, dt in steps:
        bins.setdefault(rows // bin_rows, []).append(dt)
    xs = [statistics.mean(r for r, _ in steps if r // bin_rows == k) for k in bins]
    ys = [statistics.median(v) for v in bins.values()]
    if len(xs) < 2:
        return ys[0], 0.0
    mx, my = statistics.mean(xs), statistics.mean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def chunked_schedule(lifetimes: list[int], batch_size: int) -> list[int]:
    """Rows live at each step when `lifetimes` (already in the decoder's order) run as the
    decoder runs them: equal chunks of at most batch_size, each until its longest row ends."""
    n_chunks = -(-len(lifetimes) // max(1, batch_size))
    size = -(-len(lifetimes) // max(1, n_chunks))
    live = []
    for start in range(0, len(lifetimes), size):
        chunk = lifetimes[start:start + size]
        live += [sum(1 for n in chunk if n > s) for s in range(max(chunk))]
    return live


def continuous_schedule(lifetimes: list[int], slots: int) -> list[int]:
    """Rows live at each step when every freed slot takes the next waiting prompt at once."""
    waiting, running, live = list(lifetimes), [], []
    while waiting or running:
        while waiting and len(running) < slots:
            running.append(waiting.pop(0))
        live.append(len(running))
        running = [n - 1 for n in running if n > 1]
    return live


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adapter", type=Path, default=None)
    ap.add_argument("--preset", default="cpu-tiny")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the demo's test mix (smoke tests)")
    args = ap.parse_args()
    preset = get_preset(args.preset)
    mix = {k: max(1, round(v * args.scale)) for k, v in get_preset("cpu-tiny").eval.tasks.items()}
    tasks = [t for ts in by_benchmark(draw_tasks(preset, mix, "test"), mix).values() for t in ts]
    adapter = demo_adapter(args.adapter)
    generator = make_generator(preset, adapter)
    batch = generator.batch_size
    print(f"{len(tasks)} tasks {mix}, adapter {adapter or '(none: base model)'}, batch {batch}")
    machine = machine_peak(preset)

    stamps: list[tuple[int, int, float]] = []  # (rows, tokens per row, time) at each forward
    hook = generator.model.register_forward_pre_hook(
        lambda mod, a, kw: stamps.append((*kw["input_ids"].shape, time.perf_counter())), with_kwargs=True)
    try:
        t0 = time.perf_counter()
        rollouts = run_coa(generator, tasks, make_tools(preset), preset.gen, temperature=0.0)
        wall = time.perf_counter() - t0
    finally:
        hook.remove()
    stamps.append((0, 0, time.perf_counter()))
    steps = [(rows, nxt[2] - t) for (rows, width, t), nxt in zip(stamps, stamps[1:]) if width == 1]
    a, b = fit_step_time(steps)

    def model_seconds(live: list[int]) -> float:
        return sum(a + b * r for r in live)

    # the decoder's order: prompts sorted by their tokens (decoding.decode)
    order = sorted(range(len(rollouts)), key=lambda i: rollouts[i].prompt_ids)
    # a row feeds every response token but its last one (the row leaves once it is sampled)
    lifetimes = [max(0, len(rollouts[i].response_ids) - 1) for i in order]
    chunked = chunked_schedule(lifetimes, batch)
    continuous = continuous_schedule(lifetimes, batch)
    row_steps = sum(r for r, _ in steps)
    result = {
        "tasks": len(tasks), "adapter": str(adapter) if adapter else None, "batch_size": batch,
        "wall_seconds": round(wall, 1),
        "measured": {"decode_steps": len(steps), "row_tokens": row_steps,
                     "mean_rows": round(row_steps / max(1, len(steps)), 1), "max_rows": max((r for r, _ in steps), default=0),
                     "step_seconds": round(sum(dt for _, dt in steps), 1),
                     "seconds_in_steps_under_16_rows": round(sum(dt for r, dt in steps if r < 16), 1)},
        "step_model_ms": {"a": round(a * 1000, 1), "b_per_row": round(b * 1000, 2)},
        "simulated_chunked": {"decode_steps": len(chunked), "row_tokens": sum(chunked),
                              "seconds": round(model_seconds(chunked), 1)},
        "simulated_continuous": {"decode_steps": len(continuous), "row_tokens": sum(continuous),
                                 "seconds": round(model_seconds(continuous), 1)},
    }
    result["continuous_saving"] = round(1 - model_seconds(continuous) / max(1e-9, model_seconds(chunked)), 3)
    result["machine"] = {"start": machine, "end": machine_peak(preset)}
    m, c, s = result["measured"], result["simulated_chunked"], result["simulated_continuous"]
    print(f"measured: {m['decode_steps']} steps, {m['row_tokens']} row-tokens, {m['mean_rows']} rows a step "
          f"(max {m['max_rows']}), {m['step_seconds']} s in steps, {m['seconds_in_steps_under_16_rows']} s under 16 rows")
    print(f"step model: {a * 1000:.1f} ms + {b * 1000:.2f} ms a row; chunked replay {c['decode_steps']} steps "
          f"{c['seconds']} s; continuous {s['decode_steps']} steps {s['seconds']} s: saving {result['continuous_saving']:.1%}")
    save("decode_occupancy", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
