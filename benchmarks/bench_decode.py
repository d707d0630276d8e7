"""The lab's decoder vs transformers `generate`: tokens/s and the share of the matmul peak.

Run:  python -m benchmarks.bench_decode [--batches 1 8 36 72] [--new-tokens 96]
Writes runs/bench/decode.json (under COA_LAB_RUNS if set; `--name` another name, e.g. one per
kind of machine: the bf16 and the AVX2-only draws decode differently).

Per batch size, in ONE run on the same model and prompts (held-out arithmetic questions in the
CoA format, repeated to fill the batch), greedy, every row producing exactly `--new-tokens`
tokens (EOS does not end a row in either system, so both decode the same full batch):
  - `tokens_per_s`: new tokens / wall time through `coa_lab.generation.decoding.decode` (its own in-place
    KV cache, grouped-query decode attention);
  - `generate_tokens_per_s`: the same through `model.generate` (transformers' DynamicCache);
  - `same_tokens`: whether every row's greedy tokens are identical;
  - `step_ms`: one decode step, (time for N tokens - time for 1 token) / (N - 1), prefill excluded
    (where a busy machine makes that difference negative, time for N tokens / N: an upper bound);
  - `peak_fraction`: the step's matmul work (2 x the weights of every Linear, lm_head included,
    x rows) per second, over the fp32 (or bf16 under autocast) matmul peak probed in this run;
  - `gemm_ms`: the step's matmuls alone, every Linear of the model (its own weights, the lm_head
    included) applied in order to `batch` random rows, nothing else (no attention, norms, cache,
    sampling, Python): the floor a decoder of this model reaches with this matmul library;
    `gemm_peak_fraction` its share of the peak, `step_over_gemm` = step_ms / gemm_ms: what the
    decode step spends beyond its matmuls;
  - `attention_ms`: the step's attention over the cache alone (SDPA, every layer, this batch's
    rows over a cache of the decode's mean length, in the cache's dtype): the other read a decode
    step cannot avoid; `step_over_gemm_and_attention` = step_ms / (gemm_ms + attention_ms);
  - `unpacked_tokens_per_s`: the decoder with plain F.linear (no weights packed once for oneDNN,
    decode_numerics.PACKED off), `same_tokens_as_unpacked`;
  - where bf16 autocast is on (a CPU with bf16 units): `autocast_tokens_per_s`, the decoder as it
    was before the model was held in bf16 (fp32 weights, per-op autocast, F.linear: decode_numerics.
    COMPUTE_DTYPE and PACKED off), `speedup_vs_autocast` and `same_tokens_as_autocast` (bf16
    and autocast round differently: some rows' tokens part); `fp32_tokens_per_s`, no bf16 at all.
`generate` runs in the decoder's numeric mode (decode_numerics.numeric_mode), so its tokens compare.
Targets (on a bf16 draw): at batch 72 the step <= 1.5x its matmuls and >= 2.5x the
autocast decoder's tokens/s; on an fp32 draw no slower than the unpacked decoder. `--profile` adds the top operators of a batch-36 decode step.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time


from benchmarks.results import save  # noqa: E402

from coa_lab.config import get_preset  # noqa: E402
from coa_lab.generation.decode_numerics import numeric_mode  # noqa: E402
from coa_lab.generation.decoding import decode  # noqa: E402
from coa_lab.generation.models import compute_context, load_model  # noqa: E402
from coa_lab.pipeline import draw_tasks  # noqa: E402
from coa_lab.machine import machine_peak  # noqa: E402


class NoEOS:
    """The tokenizer with no end-of-sequence token, so every row decodes exactly N tokens."""

    eos_token_id = None

    def __init__(self, tok):
        self._tok = tok

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __call__(self, *a, **k):
        return self._tok(*a, **k)


def lab_decode(model, tok, prompts, n, compute, recast: bool = False, **switches) -> tuple[float, list[list[int]]]:
    """Seconds and each row's tokens through the lab's decoder; `switches` set decode_numerics' module
    flags (COMPUTE_DTYPE, PACKED) for this call only: the benchmark's other arms. `recast`: under a
    GPU's autocast, the frozen weights not held in its dtype (benchmarks/gpu_validate.py's arm)."""
    from coa_lab.generation import decode_numerics

    if recast:  # autocast re-casts each frozen weight at every step
        switches["frozen_linears_in_autocast_dtype"] = lambda model: contextlib.nullcontext(0)

    out: dict[int, list[int]] = {}

    def finish(events):
        for index, gen in events:
            out[index] = gen.token_ids
        return [None] * len(events)

    held = {name: getattr(decode_numerics, name) for name in switches}
    for name, value in switches.items():
        setattr(decode_numerics, name, value)
    try:
        t0 = time.perf_counter()
        decode(model, NoEOS(tok), prompts, finish, max_new_tokens=n, batch_size=len(prompts), compute=compute)
        return time.perf_counter() - t0, [out[i] for i in range(len(prompts))]
    finally:
        for name, value in held.items():
            setattr(decode_numerics, name, value)


def hf_generate(model, tok, prompts, n, compute) -> tuple[float, list[list[int]]]:
    import torch

    width = max(len(p) for p in prompts)
    device = next(model.parameters()).device  # benchmarks/gpu_validate.py runs this on a GPU
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    eos = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = None  # the same N tokens per row as lab_decode
    try:
        t0 = time.perf_counter()
        with torch.no_grad(), numeric_mode(model, compute, len(prompts)):
            seqs = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                  do_sample=False, use_cache=True, pad_token_id=tok.pad_token_id)
        return time.perf_counter() - t0, seqs[:, width:].tolist()
    finally:
        model.generation_config.eos_token_id = eos


def matmul_weights(model) -> int:
    """Multiply-accumulates per token of one decode step: every Linear's weights (the lm_head's
    too: the decoder keeps one row of logits per step), not the embedding lookup."""
    import torch

    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def gemm_floor_ms(model, rows: int, compute, repeats: int = 5) -> float:
    """One decode step's matmuls and nothing else: each Linear of the model, in module order, on
    `rows` random inputs of its width, held and packed as the decoder holds them
    (decode_numerics.numeric_mode). Best of `repeats` (the floor, on a shared machine)."""
    import torch

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    device = next(model.parameters()).device
    best = float("inf")
    with torch.no_grad(), numeric_mode(model, compute, rows):
        inputs = [torch.randn(rows, m.in_features, device=device, dtype=m.weight.dtype) for m in linears]
        for _ in range(repeats + 1):  # the first is a warm-up
            t0 = time.perf_counter()
            for m, x in zip(linears, inputs):
                m(x)
            best = min(best, time.perf_counter() - t0)
    return best * 1000


def attention_floor_ms(model, rows: int, length: int, compute, repeats: int = 5) -> float:
    """One decode step's attention over the cache alone: SDPA of one query token per row against
    `length` cached keys and values, every layer, in the dtype the decoder's cache holds. Best of
    `repeats`."""
    import torch
    import torch.nn.functional as F

    config = model.config.get_text_config(decoder=True)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    device = next(model.parameters()).device
    best = float("inf")
    with torch.no_grad(), numeric_mode(model, compute, rows):
        dtype = next(model.parameters()).dtype
        layers = [(torch.randn(rows, heads, 1, dim, dtype=dtype, device=device),
                   torch.randn(rows, kv_heads, length, dim, dtype=dtype, device=device),
                   torch.randn(rows, kv_heads, length, dim, dtype=dtype, device=device))
                  for _ in range(config.num_hidden_layers)]
        mask = torch.ones(rows, 1, 1, length, dtype=torch.bool, device=device)
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            for q, k, v in layers:
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=kv_heads != heads)
            best = min(best, time.perf_counter() - t0)
    return best * 1000


def profile_step(model, tok, prompts, n, compute, top: int = 8) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        lab_decode(model, tok, prompts, n, compute)
    events = [e for e in prof.key_averages() if "::" in e.key]  # aten:: and mkldnn:: operators
    total = sum(e.self_cpu_time_total for e in events)
    ranked = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return {e.key: round(e.self_cpu_time_total / total, 3) for e in ranked}


def measure_batch(model, tok, prompts, n, compute, machine, macs, peak, repeats) -> dict:
    """Every arm on the same prompts, alternating, each its best of `repeats` runs (a shared
    machine only ever adds time). The step: (N tokens - 1 token) / (N - 1), prefill excluded."""
    b = len(prompts)
    arms = {"lab": dict(compute=compute), "one": dict(compute=compute, n=1),
            "unpacked": dict(compute=compute, PACKED=False)}
    if machine["bf16_autocast"]:
        arms["autocast"] = dict(compute=compute, COMPUTE_DTYPE=False, PACKED=False)  # the decoder before
        arms["fp32"] = dict(compute=contextlib.nullcontext)
    best, tokens = {}, {}
    for _ in range(max(1, repeats)):
        for arm, kw in arms.items():
            kw = dict(kw)
            t, tokens[arm] = lab_decode(model, tok, prompts, kw.pop("n", n), kw.pop("compute"), **kw)
            best[arm] = min(best.get(arm, float("inf")), t)
        t, tokens["generate"] = hf_generate(model, tok, prompts, n, compute)
        best["generate"] = min(best.get("generate", float("inf")), t)
    t_lab = best["lab"]
    step = (t_lab - best["one"]) / (n - 1)
    if step <= 0:  # a shared machine's noise outweighed N-1 steps (the tests' 5-token runs): the
        step = t_lab / n  # time per token, prefill included, an upper bound rather than a negative
    gemm_ms = gemm_floor_ms(model, b, compute)
    mean_cache = round(sum(map(len, prompts)) / b + n / 2)
    attention_ms = attention_floor_ms(model, b, mean_cache, compute)
    row = {"batch": b, "tokens_per_s": round(b * n / t_lab, 1), "generate_tokens_per_s": round(b * n / best["generate"], 1),
           "speedup_vs_generate": round(best["generate"] / t_lab, 2), "same_tokens": tokens["lab"] == tokens["generate"],
           "step_ms": round(step * 1000, 1), "peak_fraction": round(2 * macs * b / step / 1e9 / peak, 3),
           "gemm_ms": round(gemm_ms, 1), "gemm_peak_fraction": round(2 * macs * b / (gemm_ms / 1000) / 1e9 / peak, 3),
           "step_over_gemm": round(step * 1000 / gemm_ms, 2), "attention_ms": round(attention_ms, 1),
           "mean_cache_tokens": mean_cache,
           "step_over_gemm_and_attention": round(step * 1000 / (gemm_ms + attention_ms), 2),
           "prompt_tokens_mean": round(sum(map(len, prompts)) / b),
           "unpacked_tokens_per_s": round(b * n / best["unpacked"], 1),
           "same_tokens_as_unpacked": tokens["unpacked"] == tokens["lab"]}
    if "autocast" in best:
        row.update({"autocast_tokens_per_s": round(b * n / best["autocast"], 1),
                    "speedup_vs_autocast": round(best["autocast"] / t_lab, 2),
                    "same_tokens_as_autocast": sum(x == y for x, y in zip(tokens["autocast"], tokens["lab"])),
                    "fp32_tokens_per_s": round(b * n / best["fp32"], 1),
                    "same_tokens_as_fp32": sum(x == y for x, y in zip(tokens["fp32"], tokens["lab"]))})
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 36, 72])
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--preset", default="cpu-tiny")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--repeats", type=int, default=2, help="each arm's best of this many runs, arms alternating")
    ap.add_argument("--name", default="decode", help="result file name (runs/bench/<name>.json; docs/results/ with COA_LAB_PUBLISH=1)")
    args = ap.parse_args()
    preset = get_preset(args.preset)
    model, tok = load_model(preset.model)
    model.requires_grad_(False)  # as evaluation and RL's sampler hold the base weights
    compute = lambda: compute_context(model, preset.model)  # noqa: E731
    from coa_lab import protocol
    from coa_lab.prompts import task_messages
    from coa_lab.generation.chat_prompt import chat_prompt_ids

    tasks = draw_tasks(preset, {"math/arith": 24}, "test")
    base = [chat_prompt_ids(tok, task_messages(t.profile, t.question, protocol.PROFILE_TOOLS[t.profile]))
            for t in tasks]
    machine = machine_peak(preset)
    peak = machine["bf16_gflops"] if machine["bf16_autocast"] else machine["fp32_gflops"]
    macs = matmul_weights(model)
    n = args.new_tokens
    print(f"model {preset.model.name}: {macs / 1e6:.0f}M matmul weights; peak {peak} GFLOP/s; {n} new tokens/row")
    lab_decode(model, tok, base[:2], 4, compute)  # warm-up: first-call allocations, thread pools
    rows = []
    for b in args.batches:
        row = measure_batch(model, tok, [base[i % len(base)] for i in range(b)], n, compute, machine,
                            macs, peak, args.repeats)
        rows.append(row)
        print(f"  batch {b:3d}: {row['tokens_per_s']:7.1f} tok/s vs generate {row['generate_tokens_per_s']:7.1f} "
              f"({row['speedup_vs_generate']}x), step {row['step_ms']} ms = {row['peak_fraction']:.0%} of peak, "
              f"same tokens {row['same_tokens']}; matmuls alone {row['gemm_ms']} ms "
              f"({row['gemm_peak_fraction']:.0%} of peak), step {row['step_over_gemm']}x that; attention alone "
              f"{row['attention_ms']} ms; unpacked {row['unpacked_tokens_per_s']} tok/s"
              + (f"; autocast decoder {row['autocast_tokens_per_s']} tok/s (x{row['speedup_vs_autocast']}); "
                 f"fp32 {row['fp32_tokens_per_s']} tok/s" if "autocast_tokens_per_s" in row else ""))
    result = {"model": preset.model.name, "new_tokens": n, "matmul_weights": macs, "peak_gflops": peak,
              "batches": rows}
    if args.profile:
        result["profile_batch36"] = profile_step(model, tok, [base[i % len(base)] for i in range(36)], 24, compute)
        print("  batch-36 decode, share of operator time:", result["profile_batch36"])
    at72 = next((r for r in rows if r["batch"] == 72), None)
    result["targets"] = {
        "step_le_1.5x_matmuls_at_72": at72 is not None and at72["step_over_gemm"] <= 1.5,
        "greedy_tokens_identical": all(r["same_tokens"] for r in rows),
    }
    if at72 is not None and "speedup_vs_autocast" in at72:
        result["targets"]["ge_2.5x_the_autocast_decoder_at_72"] = at72["speedup_vs_autocast"] >= 2.5
    result["machine"] = {"start": machine, "end": machine_peak(preset)}
    print("targets:", result["targets"])
    save(args.name, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
