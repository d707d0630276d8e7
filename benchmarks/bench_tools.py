"""Benchmark the tools layer: sandbox overhead, BM25 and dense/hybrid query latency.

Run:  python -m benchmarks.bench_tools [--runs 30] [--queries 200]
      [--embed-sample 256] [--embed-corpus]
Writes runs/bench/tools.json (under COA_LAB_RUNS if set).

Targets (from the design brief): sandbox `print(1)` median <= 150 ms; BM25 query on
>= 10k passages median <= 50 ms.  Dense retrieval (optional extra) has no target: the
benchmark reports model load, corpus embedding throughput (measured on a sample; the
whole corpus only with --embed-corpus or when its embeddings are already cached) and
dense / hybrid query latency over the full corpus when its embeddings are available.
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

import numpy as np

# Runnable as `python -m benchmarks.bench_tools` from a checkout, without installing.

from coa_lab.paths import runs_dir  # noqa: E402
from coa_lab.tools.sandbox import run_python, sandbox_available  # noqa: E402
from coa_lab.tools.wiki_search import DEFAULT_CORPUS, WikiSearch, load_passages  # noqa: E402

try:  # optional extra: pip install -e '.[dense]'
    from coa_lab.tools import dense_search  # noqa: E402
    dense_search._import_extra()
    HAS_DENSE = True
except ImportError:
    HAS_DENSE = False

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


def bench_dense(queries: int, sample: int, embed_corpus: bool) -> dict:
    if not HAS_DENSE:
        return {"skipped": "optional dense extra missing (pip install -e '.[dense]')"}
    if not DEFAULT_CORPUS.exists():
        return {"skipped": f"corpus {DEFAULT_CORPUS} missing"}
    import torch

    passages = load_passages(DEFAULT_CORPUS)
    out: dict = {"passages": len(passages), "torch_threads": torch.get_num_threads()}
    start = time.perf_counter()
    encoder = dense_search.default_encoder()
    out["model_load_s"] = time.perf_counter() - start
    rng = random.Random(2)
    chunk = rng.sample(passages, min(sample, len(passages)))
    start = time.perf_counter()
    sample_emb, _ = dense_search.embed_corpus(chunk, encoder, use_cache=False)
    sample_s = time.perf_counter() - start
    # Query cost without the full corpus: encode the query (the bulk of it) and score it
    # against a corpus-sized matrix (the sample's rows tiled to len(passages)).
    tiled = np.ascontiguousarray(np.resize(sample_emb, (len(passages), sample_emb.shape[1])))
    retriever = dense_search.DenseRetriever.__new__(dense_search.DenseRetriever)
    retriever.encoder, retriever.query_threads, retriever.embeddings = encoder, 1, tiled
    probe = [" ".join(p["text"].split()[:6]) for p in chunk[: min(queries, len(chunk))]]
    samples = []
    for q in probe:
        t0 = time.perf_counter()
        retriever.ranked(q, 50)
        samples.append(time.perf_counter() - t0)
    out["dense_query_corpus_sized"] = summarize(samples)
    out.update({"embed_sample": len(chunk), "embed_sample_s": sample_s,
                "embed_passages_per_s": len(chunk) / sample_s,
                "corpus_embed_estimate_s": len(passages) * sample_s / len(chunk)})
    texts = [dense_search.passage_text(p) for p in passages]
    cache_file = dense_search.cache_dir() / "dense" / f"{dense_search.embeddings_key(texts, encoder.name)}.npy"
    if not cache_file.exists() and not embed_corpus:
        out["query_note"] = (f"full-corpus embeddings not cached ({cache_file}); rerun with --embed-corpus "
                             f"(about {out['corpus_embed_estimate_s'] / 60:.0f} min) for full-corpus query figures")
        return out
    was_cached = cache_file.exists()
    start = time.perf_counter()
    tool = WikiSearch(DEFAULT_CORPUS, mode="hybrid")
    tool.search("warm up")  # BM25 index (cached) + embeddings (cached, or computed now)
    # Includes loading the (cached) BM25 index, well under a second.
    out["cached_embeddings_load_s" if was_cached else "corpus_embed_s"] = time.perf_counter() - start
    dense = WikiSearch(DEFAULT_CORPUS, mode="dense")
    dense._passages, dense._retriever, dense._dense = tool._passages, tool._retriever, tool._dense
    query_texts = [" ".join(rng.sample(p["text"].split(), k=min(6, len(p["text"].split()))))
                   for p in rng.sample(passages, queries)]
    for name, t in (("dense_query", dense), ("hybrid_query", tool)):
        samples = []
        for q in query_texts:
            t0 = time.perf_counter()
            t.search(q, k=3)
            samples.append(time.perf_counter() - t0)
        out[name] = summarize(samples)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="sandbox executions (>= 20)")
    parser.add_argument("--queries", type=int, default=200, help="BM25 queries")
    parser.add_argument("--embed-sample", type=int, default=256, help="passages embedded to time the model")
    parser.add_argument("--embed-corpus", action="store_true",
                        help="embed the whole corpus if its embeddings are not cached (minutes on a CPU)")
    parser.add_argument("--out", type=Path, default=None, help="JSON output path")
    args = parser.parse_args(argv)
    results = {"python": sys.version.split()[0], "machine": platform.machine(),
               "sandbox_print1": bench_sandbox(max(20, args.runs)),
               "bm25_query": bench_bm25(args.queries),
               "dense": bench_dense(min(args.queries, 100), args.embed_sample, args.embed_corpus),
               "date": time.strftime("%Y-%m-%d %H:%M %Z"), "cpus": os.cpu_count(),
               "load_avg_1m": os.getloadavg()[0]}
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
    dn = results["dense"]
    if "skipped" in dn:
        print(f"dense: skipped: {dn['skipped']}")
    else:
        print(f"dense: model load {dn['model_load_s']:.1f} s; "
              f"embedding {dn['embed_passages_per_s']:.1f} passages/s "
              f"({dn['embed_sample']} sampled) -> {dn['passages']} passages ~{dn['corpus_embed_estimate_s'] / 60:.1f} min")
        for k in ("corpus_embed_s", "cached_embeddings_load_s"):
            if k in dn:
                print(f"dense: {k} {dn[k]:.1f} s")
        for k in ("dense_query_corpus_sized", "dense_query", "hybrid_query"):
            if k in dn:
                print(f"{k:<18}{dn[k]['n']:>6}{dn[k]['median_ms']:>12.1f}{dn[k]['p90_ms']:>10.1f}")
        if "query_note" in dn:
            print(f"dense: {dn['query_note']}")
    out = args.out or runs_dir() / "bench" / "tools.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
