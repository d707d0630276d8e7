"""How full the decoder's batches are during an evaluation pass, chunked vs refilled (continuous).

Run:  python -m benchmarks.bench_decode_occupancy [--adapter DIR] [--scale 1.0]
Writes runs/bench/decode_occupancy.json (under COA_LAB_RUNS if set; benchmarks/results.py).

Before continuous batching the decoder split a pass into equal chunks of at most
`gen.batch_size` rows and let finished rows leave, so a chunk ended with its longest rollout and
its last steps ran few rows. Now (coa_lab/generation/decoding.py) waiting prompts are prefilled
and join the batch as rows leave it. One greedy pass of the demo's test mix (default: the demo's
SFT adapter when `make demo` wrote it), both ways in one run (`decoding.CONTINUOUS`):

  - measured per arm: wall time, every one-token decode step's row count and duration (a forward
    pre-hook), mean occupancy, time in steps under 16 rows; `speedup` = chunked / continuous wall
    time; `same_final_answers` (greedy both ways; a different batch composition can flip a near-tie);
  - a step-time model t(rows) = a + b * rows, fitted (least squares) on the medians of the chunked
    arm's steps binned by row count (medians keep steps that also ran a tool call from skewing it);
  - each rollout's lifetime in steps (its response tokens, sampled and forced, but the last),
    replayed through both schedulers -> `simulated_chunked`, `simulated_continuous`: the replay
    of each must run the steps its arm ran (a check of the decoder's scheduling, and of the model).
Prefill is the same prompts both ways (in more, smaller pieces when refilling) and is in the
wall times, not in the replays.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


from benchmarks.results import demo_adapter, save  # noqa: E402

from coa_lab.student_rollout import run_coa  # noqa: E402
from coa_lab.config import get_preset  # noqa: E402
from coa_lab.generation.llm import make_generator  # noqa: E402
from coa_lab.pipeline import by_benchmark, draw_tasks, make_tools  # noqa: E402
from coa_lab.machine import machine_peak  # noqa: E402


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


def continuous_schedule(lifetimes: list[int], slots: int, admit_at: int = 1) -> list[int]:
    """Rows live at each step when waiting prompts join as soon as `admit_at` slots are free (or
    no row is left), in the decoder's order of events (decoding._decode_chunk): rows whose last
    token was sampled leave, the rest run one forward, then waiting prompts are admitted, counting
    a row that just ran its last forward as still there (it leaves at the next sampling)."""
    running, waiting, live = list(lifetimes[:slots]), list(lifetimes[slots:]), []
    while running or waiting:
        running = [n for n in running if n > 0]
        ran = bool(running)
        if ran:
            live.append(len(running))
            running = [n - 1 for n in running]
        free = slots - len(running)
        if waiting and (not ran or free >= admit_at):
            take = min(free, len(waiting))
            running, waiting = running + waiting[:take], waiting[take:]
    return live


def _decode_arm(generator, tasks, tools, preset, continuous: bool) -> dict:
    """Every task decoded greedy with continuous batching on or off, each decode step's rows and time stamped."""
    from coa_lab import protocol
    from coa_lab.generation import decoding

    stamps: list[tuple[int, int, float]] = []  # (rows, tokens per row, time) at each forward
    hook = generator.model.register_forward_pre_hook(
        lambda mod, a, kw: stamps.append((*kw["input_ids"].shape, time.perf_counter())), with_kwargs=True)
    decoding.CONTINUOUS = continuous
    try:
        t0 = time.perf_counter()
        rollouts = run_coa(generator, tasks, tools, preset.gen, temperature=0.0)
        wall = time.perf_counter() - t0
    finally:
        hook.remove()
        decoding.CONTINUOUS = True
    stamps.append((0, 0, time.perf_counter()))
    steps = [(rows, nxt[2] - t) for (rows, width, t), nxt in zip(stamps, stamps[1:]) if width == 1]
    return {"wall": wall, "steps": steps, "rollouts": rollouts,
            "answers": [protocol.final_answer(r.text) for r in rollouts]}


def _measured(arm: dict) -> dict:
    steps = arm["steps"]
    row_steps = sum(r for r, _ in steps)
    return {"wall_seconds": round(arm["wall"], 1), "decode_steps": len(steps), "row_tokens": row_steps,
            "mean_rows": round(row_steps / max(1, len(steps)), 1), "max_rows": max((r for r, _ in steps), default=0),
            "step_seconds": round(sum(dt for _, dt in steps), 1),
            "seconds_in_steps_under_16_rows": round(sum(dt for r, dt in steps if r < 16), 1)}


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

    from coa_lab.generation import decoding

    tools = make_tools(preset)
    arms = {name: _decode_arm(generator, tasks, tools, preset, continuous)
            for name, continuous in (("chunked", False), ("continuous", True))}
    a, b = fit_step_time(arms["chunked"]["steps"])

    def model_seconds(live: list[int]) -> float:
        return sum(a + b * r for r in live)

    # the decoder's order: prompts sorted by their tokens (decoding.decode)
    rollouts = arms["chunked"]["rollouts"]
    order = sorted(range(len(rollouts)), key=lambda i: rollouts[i].prompt_ids)

    def lifetimes(arm: str) -> list[int]:  # a row feeds every response token but its last
        return [max(0, len(arms[arm]["rollouts"][i].response_ids) - 1) for i in order]

    chunked = chunked_schedule(lifetimes("chunked"), batch)
    continuous = continuous_schedule(lifetimes("continuous"), batch, max(1, batch // decoding.ADMIT_FRACTION))
    same = sum(x == y for x, y in zip(arms["chunked"]["answers"], arms["continuous"]["answers"]))
    result = {
        "tasks": len(tasks), "adapter": str(adapter) if adapter else None, "batch_size": batch,
        "measured": _measured(arms["chunked"]), "measured_continuous": _measured(arms["continuous"]),
        "speedup": round(arms["chunked"]["wall"] / arms["continuous"]["wall"], 3),
        "same_final_answers": f"{same}/{len(tasks)}",
        "step_model_ms": {"a": round(a * 1000, 1), "b_per_row": round(b * 1000, 2)},
        "simulated_chunked": {"decode_steps": len(chunked), "row_tokens": sum(chunked),
                              "seconds": round(model_seconds(chunked), 1)},
        "simulated_continuous": {"decode_steps": len(continuous), "row_tokens": sum(continuous),
                                 "seconds": round(model_seconds(continuous), 1)},
    }
    result["continuous_saving"] = round(1 - model_seconds(continuous) / max(1e-9, model_seconds(chunked)), 3)
    result["machine"] = {"start": machine, "end": machine_peak(preset)}
    m, mc, c, s = (result["measured"], result["measured_continuous"], result["simulated_chunked"],
                   result["simulated_continuous"])
    for name, x in (("chunked", m), ("continuous", mc)):
        print(f"{name}: {x['wall_seconds']} s, {x['decode_steps']} steps, {x['row_tokens']} row-tokens, {x['mean_rows']} rows "
              f"a step (max {x['max_rows']}), {x['seconds_in_steps_under_16_rows']} s of {x['step_seconds']} under 16 rows")
    print(f"speed-up {result['speedup']}x, same answers {result['same_final_answers']}; step model: {a * 1000:.1f} ms + "
          f"{b * 1000:.2f} ms a row; replays: chunked {c['decode_steps']} steps {c['seconds']} s, continuous "
          f"{s['decode_steps']} steps {s['seconds']} s ({result['continuous_saving']:.1%} less)")
    save("decode_occupancy", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
