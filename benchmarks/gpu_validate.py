"""Prove the GPU paths through the SAME coa_lab functions the CPU demo uses (the H200
runs of 2026-11-26, made for the chunked LM head).

Run on a CUDA machine (see docs/gpu-validation.md for the recorded results):

    python -m benchmarks.gpu_validate --tokenizer DIR --out OUTDIR [--contexts 4096 8192]

Weights do not matter for speed and memory, and the GPU machine has no model hub, so the
model is the Qwen2.5-3B architecture with random weights, with the embedded SmolLM2
tokenizer files for token ids (all ids fall inside Qwen's larger vocabulary). In one process:

1. 4-bit QLoRA SFT (coa_lab.training.sft.train_sft, preset gpu-3b-qlora) at each context, with each LM
   head (coa_lab/training/lm_head.py): "plain" (every position's logits at once: the lab's head before chunking),
   "chunked" (1,024 positions at a time, recomputed in the backward) and "fused" (liger-kernel's
   fused linear cross-entropy, where it is installed): peak memory and tokens/s.
2. One DAPO update (coa_lab.rl.update.policy_update) of one group of 8 rollouts, 512 prompt
   tokens + (context - 512) response tokens, with the same heads: peak memory, seconds.
3. Rollouts at batch 64: the lab's decoder (coa_lab.generation.decoding) vs transformers
   `generate` on the same prompts, greedy, N tokens a row: tokens/s, and how many rows came out
   token for token the same (bf16 on a GPU may break a near-tie differently); each arm twice in
   mirrored order, and the decoder without its frozen-weight hold ("recast").
   `--parts decode-profile`: torch.profiler around both decoders (GPU busy time vs wall time).
4. The planner against every measurement (coa_lab.planning.plan_report.calibration on the
   file this writes): predicted / measured, the planner's error re-stated.

`--smoke` runs all of it on the CPU with a tiny random Llama and short contexts in about a
minute (tests/bench_scripts/test_benchmarks.py), so the day a GPU is lent the script is known to run.
Results: OUTDIR/gpu_validation.json, rewritten after every measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import time
from pathlib import Path


QWEN25_3B = dict(  # the published Qwen2.5-3B architecture numbers
    vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
    num_attention_heads=16, num_key_value_heads=2, max_position_embeddings=32768,
    rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
)
# --smoke: the same code paths at a size a CPU runs in seconds (vocabulary = SmolLM2's, whose ids
# the tokenizer produces)
TINY = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True)
HEADS = ("plain", "chunked", "fused")
PARTS = ("sft", "rl", "decode", "profile", "decode-profile")  # the profiles: not in the default run


class Device:
    """What differs between the GPU run and the CPU smoke run."""

    def __init__(self, smoke: bool):
        import torch

        self.smoke, self.cuda = smoke, not smoke
        self.torch = torch

    def reset_peak(self) -> None:
        if self.cuda:
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> float | None:
        return self.torch.cuda.max_memory_allocated() / 2**30 if self.cuda else None

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()


def build_random_model(tokenizer_dir: Path, target: Path, smoke: bool) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if (target / "config.json").exists():
        return target
    torch.manual_seed(0)
    if smoke:
        model = LlamaForCausalLM(LlamaConfig(**TINY))
    else:
        with torch.device("cuda"):
            model = Qwen2ForCausalLM(Qwen2Config(**QWEN25_3B, torch_dtype="bfloat16")).to(torch.bfloat16)
    model.save_pretrained(target)
    for f in tokenizer_dir.iterdir():
        if f.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            shutil.copy(f, target / f.name)
    del model
    if not smoke:
        torch.cuda.empty_cache()
    return target


@contextlib.contextmanager
def lm_head_mode(mode: str):
    """The LM head path the lab's losses take (coa_lab/training/lm_head.py) for the measurements inside.
    Yields a function: the positions that went through the fused kernel inside (0 unless "fused"
    ran it: the proof, in the results file, of which path a figure measured)."""
    from coa_lab.training import lm_head

    saved = lm_head.UNCHUNKED, os.environ.get("COA_LAB_FUSED_CE")
    lm_head.UNCHUNKED = mode == "plain"
    os.environ["COA_LAB_FUSED_CE"] = "1" if mode == "fused" else "0"
    start = lm_head.FUSED_POSITIONS
    try:
        yield lambda: lm_head.FUSED_POSITIONS - start
    finally:
        lm_head.UNCHUNKED = saved[0]
        if saved[1] is None:
            os.environ.pop("COA_LAB_FUSED_CE", None)
        else:
            os.environ["COA_LAB_FUSED_CE"] = saved[1]


def check_datasets_package() -> None:
    """transformers' Trainer (SFT) uses the `datasets` package when one is importable, and from the
    repository root the lab's own datasets/ folder is importable under that name as a namespace
    package: without the real package (the GPU image has none) the Trainer fails deep inside with
    "module 'datasets' has no attribute 'Dataset'". Say so first."""
    import datasets

    if not hasattr(datasets, "Dataset"):
        raise SystemExit("gpu_validate.py: the `datasets` package is missing (the repository's datasets/ folder is "
                         "not it): carry its wheels in, datasets==4.8.5 with dill and multiprocess "
                         "(docs/gpu-validation.md)")


def heads_available(device: Device) -> list[str]:
    from coa_lab.training import lm_head

    return [h for h in HEADS if h != "fused" or (device.cuda and lm_head._liger_kernel() is not None)]


def long_records(tokenizer, n: int, context: int):
    """Real CoA trajectories (shipped FireAct runs) concatenated to fill `context` tokens."""
    from coa_lab.distill.importers import load_imported
    from coa_lab.paths import DATASETS_DIR
    from coa_lab.trajectories import TrajectoryRecord

    pool = load_imported(DATASETS_DIR / "trajectories" / "fireact_hotpotqa_react.jsonl")
    out = []
    for i in range(n):
        parts, total = [], 0
        while total < context - min(400, context // 4):
            t = pool[(i * 7 + len(parts)) % len(pool)].text
            parts.append(t.rsplit("<answer>", 1)[0])
            total += len(tokenizer(t, add_special_tokens=False)["input_ids"])
        text = "\n".join(parts) + "<answer>done</answer>"
        out.append(TrajectoryRecord(f"r{i}", f"r{i}", "bench", "mhqa", "benchmark question", ["done"], text))
    return out


def preset_for(model_dir: Path, device: Device, **sections):
    from coa_lab.config import get_preset

    model = {"name": str(model_dir), "use_unsloth": False, "load_in_4bit": device.cuda}
    if device.smoke:
        model.update(dtype="float32", lora_r=4)
    return get_preset("gpu-3b-qlora", model=model, **sections)


def sft_run(model_dir: Path, tokenizer, context: int, head: str, device: Device, out: Path, steps: int) -> dict:
    from coa_lab.training.sft import train_sft

    preset = preset_for(model_dir, device, sft={"max_length": context, "epochs": 1, "batch_size": 1, "grad_accum": 1})
    records = long_records(tokenizer, steps, context)
    device.reset_peak()
    with lm_head_mode(head) as fused:
        res = train_sft(preset, records, out)
    return {"context": context, "four_bit": preset.model.load_in_4bit, "lm_head": head, "fused_positions": fused(),
            "steps": len(res.losses),
            "loss_first": res.losses[0], "loss_last": res.losses[-1], "train_seconds": res.train_seconds,
            "tokens_per_s": res.total_tokens / max(res.train_seconds, 1e-9), "peak_mem_gib": device.peak_gib(),
            "masked_observation_tokens": res.masked_observation_tokens}


def dapo_run(model, tok, preset, context: int, prompt_len: int, head: str, device: Device) -> dict:
    import torch

    from coa_lab.student_rollout import Rollout
    from coa_lab.generation.models import compute_context
    from coa_lab.rl.update import policy_update

    rng = random.Random(0)
    response_len = context - prompt_len
    observation = min(256, response_len // 4)  # a tool result in the middle, masked out of the loss
    group = []
    for _ in range(preset.rl.group_size):
        r = Rollout(task=None, prompt_ids=[rng.randrange(1000, 40000) for _ in range(prompt_len)])
        r.response_ids = [rng.randrange(1000, 40000) for _ in range(response_len)]
        r.response_mask = [1] * response_len
        r.response_mask[response_len // 2 : response_len // 2 + observation] = [0] * observation
        group.append(r)
    rewards = [[1.0 if g % 3 == 0 else 0.0 for g in range(preset.rl.group_size)]]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=preset.rl.learning_rate)
    device.reset_peak()
    t0 = time.time()
    with lm_head_mode(head) as fused:
        stats = policy_update(model, opt, [group], rewards, preset, tok.pad_token_id,
                              compute=lambda: compute_context(model, preset.model))  # as rl/trainer.py does
    device.sync()
    seconds = time.time() - t0
    del opt
    return {"four_bit": preset.model.load_in_4bit, "lm_head": head, "fused_positions": fused(),
            "group_size": preset.rl.group_size,
            "prompt_len": prompt_len, "response_len": response_len, "seconds": seconds,
            "peak_mem_gib": device.peak_gib(), **{k: v for k, v in stats.items() if isinstance(v, (int, float))}}


def profile_update(model, tok, preset, context: int, prompt_len: int, device: Device, top: int = 20) -> dict:
    """torch.profiler around one DAPO update (chunked head): the operators that take its time.
    Why: the 2026-11-26 H200 run's SFT and DAPO throughput was 2.4-7x below the 2026-11-23 H100
    run's for the same shapes, cause unknown (docs/gpu-validation.md); this says where it goes."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.cuda else [])
    with profile(activities=activities) as prof:
        run = dapo_run(model, tok, preset, context, prompt_len, "chunked", device)
    # torch >= 2.4 names the GPU's time "device" (self_cuda_time_total is gone in 2.11)
    key = "self_device_time_total" if device.cuda else "self_cpu_time_total"
    averages = prof.key_averages()
    events = sorted(averages, key=lambda e: getattr(e, key), reverse=True)[:top]
    total = sum(getattr(e, key) for e in averages) or 1.0
    cpu_total = sum(e.self_cpu_time_total for e in averages)
    # summed over every event: an aten operator and the kernels it launches both count, so this is
    # not the GPU's busy time (the 2026-11-26 H200 profile summed 48.9 s for a 38.1 s update)
    return {"context": context, "seconds": run["seconds"], "sorted_by": key,
            "summed_seconds": total / 1e6, "host_summed_seconds": cpu_total / 1e6,
            "top": [{"op": e.key, "share": getattr(e, key) / total, "calls": e.count} for e in events]}


def decode_run(model, tok, batch: int, new_tokens: int, compute=contextlib.nullcontext) -> dict:
    """The lab's decoder vs transformers `generate`: the same prompts, greedy, N tokens a row, best
    of two runs per arm. Also the lab's decoder with autocast re-casting every frozen weight at
    every step (as before decode_numerics.frozen_linears_in_autocast_dtype held them in bf16): the suspect
    for its x0.48 of `generate` on the H200, which the H100 run traced to the order of measurement
    (docs/gpu-validation.md)."""
    from benchmarks.bench_decode import hf_generate, lab_decode

    prompts = decode_prompts(tok, batch)
    lab_decode(model, tok, prompts[:2], 4, compute)  # warm-up
    hf_generate(model, tok, prompts[:2], 4, compute)
    # every arm twice, in mirrored order (lab, generate, re-cast, re-cast, generate, lab): a GPU's
    # first long run after warm-up was measured slower, and one order would credit that to an arm
    arms = {"lab": lambda: lab_decode(model, tok, prompts, new_tokens, compute),
            "generate": lambda: hf_generate(model, tok, prompts, new_tokens, compute),
            "recast": lambda: lab_decode(model, tok, prompts, new_tokens, compute, recast=True)}
    seconds: dict[str, list[float]] = {k: [] for k in arms}
    runs: dict[str, list] = {k: [] for k in arms}
    for name in [*arms, *reversed(arms)]:
        t, got = arms[name]()
        seconds[name].append(t)
        runs[name].append(got)
    tokens = {k: v[-1] for k, v in runs.items()}
    rate = {k: [batch * new_tokens / t for t in v] for k, v in seconds.items()}
    t_lab, t_gen = min(seconds["lab"]), min(seconds["generate"])
    return {"batch": batch, "new_tokens": new_tokens, "tokens_per_s": batch * new_tokens / t_lab,
            "generate_tokens_per_s": batch * new_tokens / t_gen, "speedup_vs_generate": t_gen / t_lab,
            "recast_tokens_per_s": max(rate["recast"]), "tokens_per_s_each_run": rate,
            "rows_with_same_tokens": sum(a == b for a, b in zip(tokens["lab"], tokens["generate"])),
            "rows_same_as_recast": sum(a == b for a, b in zip(tokens["lab"], tokens["recast"])),
            # the same arm twice: whether the GPU's kernels give one answer for one input at all
            "rows_same_between_runs": {k: sum(a == b for a, b in zip(*v)) for k, v in runs.items()}}


def decode_prompts(tok, batch: int) -> list[list[int]]:
    from coa_lab.generation.chat_prompt import chat_prompt_ids

    return [chat_prompt_ids(tok, [{"role": "user", "content": f"Question {i}: what is {i} * {i + 7} minus {3 * i}?"}])
            for i in range(batch)]


def profile_decode(model, tok, batch: int, new_tokens: int, device: Device, compute=contextlib.nullcontext,
                   top: int = 12) -> dict:
    """torch.profiler around the lab's decoder and around `generate`, the same prompts: per path the
    wall time, the GPU's summed kernel time and the host's, and the top operators by GPU time. A
    path whose wall time is far above its GPU time is bound by the host (Python, launches, syncs)."""
    from benchmarks.bench_decode import hf_generate, lab_decode
    from torch.profiler import ProfilerActivity, profile

    prompts = decode_prompts(tok, batch)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.cuda else [])
    key = "self_device_time_total" if device.cuda else "self_cpu_time_total"
    out = {"batch": batch, "new_tokens": new_tokens, "sorted_by": key}
    for name, run in (("lab", lambda: lab_decode(model, tok, prompts, new_tokens, compute)),
                      ("generate", lambda: hf_generate(model, tok, prompts, new_tokens, compute))):
        run()  # warm
        with profile(activities=activities) as prof:
            seconds, _ = run()
        averages = prof.key_averages()
        kernels = [e for e in averages if not e.key.startswith(("aten::", "cuda", "autograd"))] if device.cuda else averages
        device_total = sum(getattr(e, key) for e in kernels)
        ranked = sorted(averages, key=lambda e: getattr(e, key), reverse=True)[:top]
        out[name] = {"wall_seconds": seconds, "device_kernel_seconds": device_total / 1e6,
                     "host_summed_seconds": sum(e.self_cpu_time_total for e in averages) / 1e6,
                     "top": [{"op": e.key, "device_s": getattr(e, key) / 1e6, "calls": e.count} for e in ranked]}
    return out


def summarize(results: dict) -> dict:
    """The LM-head and decoder figures from the entries: each head's peak over the plain head's, per part and
    context (the target: <= 0.70 at 8k), and the decoder's speed over `generate`."""
    def peaks(entries, length):
        return {(length(e), e["lm_head"]): e["peak_mem_gib"] for e in entries if e.get("peak_mem_gib")}

    out = {}
    for part, entries, length in (("sft", results["sft"], lambda e: e["context"]),
                                  ("dapo", [r["dapo"] for r in results["rl"]],
                                   lambda e: e["prompt_len"] + e["response_len"])):
        got = peaks(entries, length)
        out[f"{part}_peak_vs_plain"] = {f"{ctx}_{head}": round(peak / got[(ctx, "plain")], 3)
                                        for (ctx, head), peak in sorted(got.items())
                                        if head != "plain" and (ctx, "plain") in got}
    if results["decode"]:
        out["decode_speedup_vs_generate"] = round(results["decode"][-1]["speedup_vs_generate"], 3)
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model-dir", type=Path, default=None)
    p.add_argument("--contexts", type=int, nargs="+", default=None, help="default 4096 8192 (smoke: 256 512)")
    p.add_argument("--steps", type=int, default=2, help="SFT optimizer steps per configuration")
    p.add_argument("--decode-batch", type=int, default=64)
    p.add_argument("--decode-tokens", type=int, default=None, help="default 128 (smoke: 6)")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS[:3]),
                   help="what to measure (default: sft rl decode; all three took > 9 min on an H200: split them over calls)")
    p.add_argument("--heads", nargs="+", choices=HEADS, default=None, help="LM heads to compare (default: all available)")
    p.add_argument("--smoke", action="store_true", help="on the CPU, a tiny random model: checks the script runs")
    return p


def _versions(device: Device) -> dict:
    """What the numbers were measured with; an optional package that fails to import says why."""
    import torch
    import transformers

    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "gpu": torch.cuda.get_device_name(0) if device.cuda else "none (--smoke)"}
    for name in ("peft", "bitsandbytes", "unsloth", "vllm", "liger_kernel"):
        try:
            versions[name] = getattr(__import__(name), "__version__", "installed")
        except Exception as exc:  # noqa: BLE001 - record why, keep going
            versions[name] = f"not available ({type(exc).__name__})"
    return versions


def _measured(run, **where) -> dict:
    """A measurement, or where it ran out of GPU memory (the plain head at 8k may: that is a
    result too, and the run goes on)."""
    import torch

    try:
        return run()
    except torch.cuda.OutOfMemoryError as exc:
        torch.cuda.empty_cache()
        return {**where, "oom": True, "peak_mem_gib": None, "error": str(exc).splitlines()[0]}


def main(argv: list[str] | None = None) -> int:
    import torch

    args = _parser().parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("gpu_validate.py proves the GPU paths: run it on a CUDA machine (or --smoke on a CPU)")
    if "sft" in args.parts:
        check_datasets_package()
    device = Device(args.smoke)
    contexts = args.contexts or ([256, 512] if args.smoke else [4096, 8192])
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = args.model_dir or args.out / ("tiny-random" if args.smoke else "qwen25-3b-random")
    versions = _versions(device)
    print(json.dumps(versions), flush=True)
    t0 = time.time()
    build_random_model(args.tokenizer, model_dir, args.smoke)
    heads = [h for h in heads_available(device) if args.heads is None or h in args.heads]
    results = {"versions": versions, "smoke": args.smoke, "parts": args.parts, "build_seconds": time.time() - t0,
               "lm_heads": heads, "sft": [], "rl": [], "decode": []}
    path = args.out / "gpu_validation.json"
    _measure_parts(args, device, model_dir, contexts, heads, results, path)
    _finish(results, path, device, args.out)
    return 0


def _measure_parts(args, device: Device, model_dir: Path, contexts: list[int], heads: list[str], results: dict,
                   path: Path) -> None:
    """Each asked-for part in turn, the result file rewritten after every measurement (a call cut short keeps
    what it measured)."""
    from transformers import AutoTokenizer

    from coa_lab.generation.models import compute_context, load_model

    def save(entry_kind: str, entry: dict) -> None:
        results[entry_kind].append(entry)
        print(json.dumps({entry_kind: entry}), flush=True)
        path.write_text(json.dumps(results, indent=2))

    tok = AutoTokenizer.from_pretrained(model_dir)
    if "sft" in args.parts:
        sft_run(model_dir, tok, contexts[0] // 4, "chunked", device, args.out / "sft_warmup", 1)  # CUDA context
        for ctx in contexts:
            for head in heads:
                save("sft", _measured(lambda: sft_run(model_dir, tok, ctx, head, device, args.out / f"sft_{ctx}_{head}",
                                                      args.steps), context=ctx, lm_head=head, four_bit=device.cuda))
    preset = preset_for(model_dir, device)
    model, _ = load_model(preset.model, trainable=True)
    prompt_len = min(512, contexts[0] // 4)
    new_tokens = args.decode_tokens or (6 if args.smoke else 128)

    def in_generator_mode():  # the generator's mode (autocast or not), as decoding runs it
        return compute_context(model, preset.model)

    if "decode" in args.parts:  # first: the shortest part, and the one that needs no gradients
        model.eval()
        save("decode", decode_run(model, tok, args.decode_batch, new_tokens, in_generator_mode))
        model.train()
    if "decode-profile" in args.parts:
        model.eval()
        results["decode_profile"] = profile_decode(model, tok, args.decode_batch, max(4, new_tokens // 4), device,
                                                   in_generator_mode)
        print(json.dumps({"decode_profile": {k: v for k, v in results["decode_profile"].items()
                                             if k in ("lab", "generate")}})[:4000], flush=True)
        path.write_text(json.dumps(results, indent=2))
        model.train()
    if "rl" in args.parts:
        for ctx in contexts:
            for head in heads:
                save("rl", {"dapo": _measured(lambda: dapo_run(model, tok, preset, ctx, prompt_len, head, device),
                                              lm_head=head, prompt_len=prompt_len, response_len=ctx - prompt_len)})
    if "profile" in args.parts:
        results["profile"] = profile_update(model, tok, preset, contexts[0], prompt_len, device)
        print(json.dumps({"profile": results["profile"]["top"][:8]}), flush=True)
        path.write_text(json.dumps(results, indent=2))


def _finish(results: dict, path: Path, device: Device, out: Path) -> None:
    """The summary and, on a GPU, the plan's predictions against what was measured."""
    from coa_lab.planning.plan_report import calibration, format_calibration

    results["summary"] = summarize(results)
    rows = calibration(path) if device.cuda else []  # a tiny CPU model against the 3B plan means nothing
    results["calibration"] = [{"run": r.run, "quantity": r.quantity, "predicted": r.predicted, "measured": r.measured,
                               "ratio": r.ratio} for r in rows]
    path.write_text(json.dumps(results, indent=2))
    if rows:
        print(format_calibration(rows))
    for d in out.glob("sft_*"):
        shutil.rmtree(d, ignore_errors=True)  # adapters are not results


if __name__ == "__main__":
    raise SystemExit(main())
