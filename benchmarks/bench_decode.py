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
  - under bf16 autocast, `fp32_tokens_per_s`: the lab's decoder without autocast (fp32 matmuls),
    to see whether bf16 pays off for a decode step as it does for training's wide matmuls;
  - under bf16 autocast, `recast_tokens_per_s`: the lab's decoder without holding the frozen
    weights in bf16 while it decodes (decoding.frozen_linears_in_autocast_dtype), i.e. autocast
    casting every weight from fp32 again at every step, as it did before that fix.
The weights are frozen, as evaluation (an adapter loaded for inference) and RL's sampler (LoRA
on a frozen base) hold them: autocast keeps its cast only of weights that require grad.
Targets: >= 2.5x `generate` at batch 36; a decode step at batch >= 36 at >= 40% of
the measured peak. `--profile` adds the top operators of a batch-36 decode step.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time


from benchmarks.results import save  # noqa: E402

from coa_lab.config import get_preset  # noqa: E402
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


def lab_decode(model, tok, prompts, n, compute, recast: bool = False) -> tuple[float, list[list[int]]]:
    from coa_lab.generation import decoding

    out: dict[int, list[int]] = {}

    def finish(events):
        for index, gen in events:
            out[index] = gen.token_ids
        return [None] * len(events)

    held = decoding.frozen_linears_in_autocast_dtype
    if recast:  # the decoder before the fix: autocast re-casts each frozen weight at every step
        decoding.frozen_linears_in_autocast_dtype = lambda model: contextlib.nullcontext(0)
    try:
        t0 = time.perf_counter()
        decode(model, NoEOS(tok), prompts, finish, max_new_tokens=n, batch_size=len(prompts), compute=compute)
        return time.perf_counter() - t0, [out[i] for i in range(len(prompts))]
    finally:
        decoding.frozen_linears_in_autocast_dtype = held


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
        with torch.no_grad(), compute():
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
    `rows` random inputs of its width (under the decoder's numeric mode, the frozen weights held
    as the decoder holds them). Best of `repeats` (the floor, on a shared machine)."""
    import torch

    from coa_lab.generation.decoding import frozen_linears_in_autocast_dtype

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    device = next(model.parameters()).device
    inputs = [torch.randn(rows, m.in_features, device=device) for m in linears]
    best = float("inf")
    with torch.no_grad(), compute(), frozen_linears_in_autocast_dtype(model):
        for _ in range(repeats + 1):  # the first is a warm-up
            t0 = time.perf_counter()
            for m, x in zip(linears, inputs):
                m(x)
            best = min(best, time.perf_counter() - t0)
    return best * 1000


def profile_step(model, tok, prompts, n, compute, top: int = 8) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        lab_decode(model, tok, prompts, n, compute)
    events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    total = sum(e.self_cpu_time_total for e in events)
    ranked = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return {e.key: round(e.self_cpu_time_total / total, 3) for e in ranked}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 36, 72])
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--preset", default="cpu-tiny")
    ap.add_argument("--profile", action="store_true")
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
        prompts = [base[i % len(base)] for i in range(b)]
        t_lab, lab_tokens = lab_decode(model, tok, prompts, n, compute)
        t_one, _ = lab_decode(model, tok, prompts, 1, compute)
        t_gen, gen_tokens = hf_generate(model, tok, prompts, n, compute)
        if machine["bf16_autocast"]:
            t_recast, recast_tokens = lab_decode(model, tok, prompts, n, compute, recast=True)
            t_fp32, fp32_tokens = lab_decode(model, tok, prompts, n, contextlib.nullcontext)
        gemm_ms = gemm_floor_ms(model, b, compute)
        step = (t_lab - t_one) / (n - 1)
        if step <= 0:  # a shared machine's noise outweighed N-1 steps (the tests' 5-token runs): the
            step = t_lab / n  # time per token, prefill included, an upper bound rather than a negative
        row = {"batch": b, "tokens_per_s": round(b * n / t_lab, 1), "generate_tokens_per_s": round(b * n / t_gen, 1),
               "speedup_vs_generate": round(t_gen / t_lab, 2), "same_tokens": lab_tokens == gen_tokens,
               "step_ms": round(step * 1000, 1),
               "peak_fraction": round(2 * macs * b / step / 1e9 / peak, 3),
               "gemm_ms": round(gemm_ms, 1), "gemm_peak_fraction": round(2 * macs * b / (gemm_ms / 1000) / 1e9 / peak, 3),
               "step_over_gemm": round(step * 1000 / gemm_ms, 2),
               "prompt_tokens_mean": round(sum(map(len, prompts)) / b)}
        if machine["bf16_autocast"]:
            row["recast_tokens_per_s"] = round(b * n / t_recast, 1)
            row["same_tokens_as_recast"] = recast_tokens == lab_tokens
            row["fp32_tokens_per_s"] = round(b * n / t_fp32, 1)
            row["same_tokens_as_fp32"] = fp32_tokens == lab_tokens
        rows.append(row)
        print(f"  batch {b:3d}: {row['tokens_per_s']:7.1f} tok/s vs generate {row['generate_tokens_per_s']:7.1f} "
              f"({row['speedup_vs_generate']}x), step {row['step_ms']} ms = {row['peak_fraction']:.0%} of peak, "
              f"same tokens {row['same_tokens']}; matmuls alone {row['gemm_ms']} ms "
              f"({row['gemm_peak_fraction']:.0%} of peak), step {row['step_over_gemm']}x that"
              + (f"; re-casting weights every step {row['recast_tokens_per_s']} tok/s; fp32 {row['fp32_tokens_per_s']} tok/s"
                 if "recast_tokens_per_s" in row else ""))
    result = {"model": preset.model.name, "new_tokens": n, "matmul_weights": macs, "peak_gflops": peak,
              "batches": rows}
    if args.profile:
        result["profile_batch36"] = profile_step(model, tok, [base[i % len(base)] for i in range(36)], 24, compute)
        print("  batch-36 decode, share of operator time:", result["profile_batch36"])
    at36 = next((r for r in rows if r["batch"] == 36), None)
    wide = [r for r in rows if r["batch"] >= 36]
    result["targets"] = {
        "speedup_at_36_ge_2.5": at36 is not None and at36["speedup_vs_generate"] >= 2.5,
        "peak_fraction_wide_ge_0.4": bool(wide) and all(r["peak_fraction"] >= 0.4 for r in wide),
        "greedy_tokens_identical": all(r["same_tokens"] for r in rows),
    }
    result["machine"] = {"start": machine, "end": machine_peak(preset)}
    print("targets:", result["targets"])
    save(args.name, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
