"""Benchmark capture from a remote teacher: requests in flight at once vs one at a time.

Run:  python -m benchmarks.bench_capture [--tasks 32] [--concurrency 8] [--delay 0.2] [--fail-rate 0.15]
Writes runs/bench/capture.json (under COA_LAB_RUNS if set; benchmarks/results.py).

The teacher is coa_lab/serve/stub_teacher.py on a loopback port: every request waits `--delay`
seconds (a hosted model's latency) and a `--fail-rate` share of them answer 429 or 500, which
the client retries with backoff. The same tasks are captured twice through the real capture
driver (capture/recorder.py) with the real tools (sandboxed code, BM25 wiki search): once with
one run in flight, once with `--concurrency` runs in flight. Both must record every task with
no failed run; the ratio of their wall times is the figure (goal: <= 0.25 at concurrency 8).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


from benchmarks.results import save  # noqa: E402

from coa_lab.capture.recorder import capture_runs  # noqa: E402
from coa_lab.config import get_preset  # noqa: E402
from coa_lab.generation.openai_backend import OpenAIChatBackend  # noqa: E402
from coa_lab.serve.stub_teacher import serve_in_thread, stub_app  # noqa: E402
from coa_lab.pipeline import draw_tasks, make_tools  # noqa: E402
from coa_lab.machine import machine_peak  # noqa: E402


def timed_capture(url: str, tasks, tools, preset, concurrency: int, out: Path) -> dict:
    backend = OpenAIChatBackend(url, "stub-teacher", concurrency=concurrency, max_retries=12, backoff_s=0.05,
                                max_backoff_s=1.0)
    t0 = time.perf_counter()
    result = capture_runs(backend, tasks, tools, preset, out, teacher="stub-teacher", resume=False, progress=False)
    seconds = time.perf_counter() - t0
    backend.close()
    return {"concurrency": concurrency, "seconds": round(seconds, 2), "runs": len(result.runs),
            "failed_runs": result.failed, "requests": backend.requests, "retries": backend.retries,
            "distinct_tasks": len({r.task_id for r in result.runs})}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--delay", type=float, default=0.2, help="seconds the stub teacher takes per request")
    ap.add_argument("--fail-rate", type=float, default=0.15, help="share of requests answered 429 or 500")
    ap.add_argument("--preset", default="cpu-tiny")
    args = ap.parse_args()
    preset = get_preset(args.preset)
    half = args.tasks // 2
    tasks = draw_tasks(preset, {"math/arith": args.tasks - half, "mhqa/lookup": half}, "train")
    tools = make_tools(preset)
    print(f"{len(tasks)} tasks, stub teacher: {args.delay} s per request, {args.fail_rate:.0%} answered 429/500")
    arms = {}
    with tempfile.TemporaryDirectory() as tmp, serve_in_thread(stub_app(args.delay, args.fail_rate, seed=0)) as url:
        for c in (1, args.concurrency):
            arms[c] = timed_capture(url, tasks, tools, preset, c, Path(tmp) / f"c{c}.jsonl")
            a = arms[c]
            print(f"  concurrency {c:2d}: {a['seconds']:6.1f} s, {a['runs']} runs ({a['failed_runs']} failed), "
                  f"{a['requests']} requests, {a['retries']} retried")
    serial, parallel = arms[1], arms[args.concurrency]
    ratio = parallel["seconds"] / serial["seconds"]
    complete = all(a["distinct_tasks"] == len(tasks) and a["failed_runs"] == 0 for a in arms.values())
    result = {"tasks": len(tasks), "delay_s": args.delay, "fail_rate": args.fail_rate, "serial": serial,
              "concurrent": parallel, "time_ratio": round(ratio, 3), "goal_ratio": 0.25,
              "every_task_recorded": complete, "machine": machine_peak(preset)}
    print(f"wall time at concurrency {args.concurrency} / concurrency 1: {ratio:.3f} (goal <= 0.25); "
          f"every task recorded, none failed: {complete}")
    save("capture", result)
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
