"""Benchmark the tools layer: sandbox overhead per execution and BM25 query latency.

Run:  PYTHONPATH=. python benchmarks/bench_tools.py [--runs 30] [--queries 200]
Writes runs/bench/tools.json (under COA_LAB_RUNS if set).

Targets (from the design brief): sandbox `print(1)` median <= 150 ms; BM25 query on
>= 10k passages median <= 50 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Runnable as `python benchmarks/bench_tools.py` from a checkout, without installing.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from coa_lab.paths import runs_dir  # noqa: E402
from coa_lab.tools.sandbox import run_python, sandbox_available  # noqa: E402
from coa_lab.tools.wiki_search import DEFAULT_CORPUS, WikiSearch, load_passages  # noqa: E402

SANDBOX_TARGET_MS = 150.0
BM25_TARGET_MS = 50.0
MIN_PASSAGES = 10_000


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[idx]


def summarize(samples_s: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples_s]
    return {"n": len(ms), "median_ms": statistics.median(ms), "p90_ms": percentile(ms, 0.9),
            "min_ms": min(ms), "max_ms": max(ms)}


def bench_sandbox(runs: int) -> dict:
    if not sandbox_available():
        return {"skipped": "bwrap missing or not working"}
    run_python("print(1)")  # warm-up: the cached bwrap probe and the page cache
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        res = run_python("print(1)")
        samples.append(time.perf_counter() - start)
        assert res.stdout.strip() == "1", res
    numpy_samples = []
    for _ in range(max(3, runs // 5)):
        start = time.perf_counter()
        run_python("import numpy; print(numpy.ones(3).sum())")
        numpy_samples.append(time.perf_counter() - start)
    out = summarize(samples)
    out["numpy_import_median_ms"] = statistics.median(numpy_samples) * 1000
    out["target_ms"] = SANDBOX_TARGET_MS
    out["meets_target"] = out["median_ms"] <= SANDBOX_TARGET_MS
    return out


def synthetic_passages(seed_passages: list[dict], n: int) -> list[dict]:
    """Recombine sentences of real passages into ``n`` passages with a realistic vocabulary."""
    rng = random.Random(0)
    words = " ".join(p["text"] for p in seed_passages).split() or ["alpha", "beta", "gamma"]
    rows = []
    for i in range(n):
        length = rng.randint(40, 120)
        rows.append({"id": f"s{i}", "title": " ".join(rng.choices(words, k=3)),
                     "text": " ".join(rng.choices(words, k=length))})
    return rows


def bench_bm25(queries: int) -> dict:
    source = "shipped corpus"
    if DEFAULT_CORPUS.exists():
        passages = load_passages(DEFAULT_CORPUS)
    else:
        passages = []
        source = "synthetic"
    if len(passages) < MIN_PASSAGES:
        passages = passages + synthetic_passages(passages, MIN_PASSAGES - len(passages))
        source += f" + synthetic to {MIN_PASSAGES}"
    start = time.perf_counter()
    if source == "shipped corpus":
        saved = os.environ.get("COA_LAB_CACHE")
        with tempfile.TemporaryDirectory() as cache:  # measure a cold build, not the user's cache
            os.environ["COA_LAB_CACHE"] = cache
            try:
                ws = WikiSearch(DEFAULT_CORPUS)
                ws.search("warm up")
                build_s = time.perf_counter() - start
                start = time.perf_counter()
                WikiSearch(DEFAULT_CORPUS).search("warm up")
                cached_load_s = time.perf_counter() - start
            finally:
                if saved is None:
                    os.environ.pop("COA_LAB_CACHE", None)
                else:
                    os.environ["COA_LAB_CACHE"] = saved
    else:
        ws = WikiSearch.from_passages(passages)
        build_s, cached_load_s = time.perf_counter() - start, float("nan")
    rng = random.Random(1)
    query_texts = []
    for _ in range(queries):
        p = rng.choice(passages)
        words = (p["title"] + " " + p["text"]).split()
        query_texts.append(" ".join(rng.sample(words, k=min(6, len(words)))))
    samples = []
    for q in query_texts:
        t = time.perf_counter()
        ws.search(q, k=3)
        samples.append(time.perf_counter() - t)
    out = summarize(samples)
    out.update({"passages": len(passages), "source": source, "index_build_s": build_s,
                "cached_index_load_s": cached_load_s, "target_ms": BM25_TARGET_MS,
                "meets_target": out["median_ms"] <= BM25_TARGET_MS})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="sandbox executions (>= 20)")
    parser.add_argument("--queries", type=int, default=200, help="BM25 queries")
    parser.add_argument("--out", type=Path, default=None, help="JSON output path")
    args = parser.parse_args(argv)
    results = {"python": sys.version.split()[0], "machine": platform.machine(),
               "sandbox_print1": bench_sandbox(max(20, args.runs)),
               "bm25_query": bench_bm25(args.queries)}
    print(f"{'benchmark':<18}{'n':>6}{'median ms':>12}{'p90 ms':>10}{'target ms':>11}  ok")
    for key in ("sandbox_print1", "bm25_query"):
        r = results[key]
        if "skipped" in r:
            print(f"{key:<18}  skipped: {r['skipped']}")
            continue
        print(f"{key:<18}{r['n']:>6}{r['median_ms']:>12.1f}{r['p90_ms']:>10.1f}{r['target_ms']:>11.0f}  "
              f"{'yes' if r['meets_target'] else 'NO'}")
    sb, bm = results["sandbox_print1"], results["bm25_query"]
    if "numpy_import_median_ms" in sb:
        print(f"sandbox + `import numpy`: median {sb['numpy_import_median_ms']:.0f} ms")
    print(f"BM25: {bm['passages']} passages ({bm['source']}), index build {bm['index_build_s']:.2f} s, "
          f"cached load {bm['cached_index_load_s']:.2f} s")
    out = args.out or runs_dir() / "bench" / "tools.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
