"""The GPU measurement issue 13 leaves open, through the lab's own functions. PREPARED, NOT YET
RUN: no GPU was lent to the session that wrote it (docs/gpu-validation.md says what is open).

    pip install --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
    python -m benchmarks.gpu_vllm --tokenizer DIR --out OUTDIR

The vLLM wheel must match the machine's torch (vllm 0.33.0 needs torch 2.14.0; the lent H100
image had 2.11: use the vLLM release built for it). Like gpu_validate.py, the model is the
Qwen2.5-3B architecture with random weights (speed does not depend on them; the machine has no
hub), with a LoRA adapter of the gpu-3b-qlora preset's rank on every linear layer.

1. Rollout throughput, the same prompts and the same model + adapter, in one process:
   coa_lab.generation.hf_generator.HFGenerator (transformers + the lab's cache-keeping decoder) and then
   coa_lab.generation.vllm_engine.VLLMGenerator, each sampling --new-tokens per prompt at temperature 1.0.
   tokens/s counts the tokens each produced; the ratio is the issue's >= 10x check.
2. One RL step with gen.backend="vllm": coa_lab.rl.trainer.train_rl samples from the
   in-process engine (gen.vllm_memory_fraction of the GPU), computes the DAPO update of the
   LoRA, saves it to rl/sampler/step0 and points the engine at it (the adapter push).
Results go to OUTDIR/gpu_vllm.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


from benchmarks.gpu_validate import build_random_model  # noqa: E402 - the same random Qwen2.5-3B

LORA_R = 64  # the gpu-3b-qlora preset's


def prompts_for(tokenizer, n: int) -> list[list[int]]:
    """The lab's own rollout prompts (the CoA system prompt and a math question per row)."""
    from coa_lab.prompts import task_messages
    from coa_lab.generation.chat_prompt import chat_prompt_ids

    return [chat_prompt_ids(tokenizer, task_messages("math", f"What is {1000 + 37 * i} * {17 + i}?", ["code"]))
            for i in range(n)]


def timed(generate) -> tuple[list, float]:
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = generate()
    torch.cuda.synchronize()
    return outs, time.perf_counter() - t0


def throughput(model_dir: Path, adapter: Path, tokenizer, n: int, new_tokens: int, memory_fraction: float) -> dict:
    import torch

    from coa_lab.config import ModelConfig
    from coa_lab.generation.hf_generator import HFGenerator
    from coa_lab.generation.models import load_model
    from coa_lab.generation.vllm_engine import VLLMGenerator

    prompts = prompts_for(tokenizer, n)
    cfg = ModelConfig(name=str(model_dir), dtype="bfloat16", lora_r=LORA_R, lora_alpha=2 * LORA_R)
    model, tok = load_model(cfg, adapter=adapter)
    hf = HFGenerator(model, tok, batch_size=n)
    hf.generate(prompts[:2], 8)  # warm-up: not recorded
    outs, hf_s = timed(lambda: hf.generate(prompts, new_tokens, temperature=1.0))
    hf_tokens = sum(o.completion_tokens for o in outs)
    del hf, model
    torch.cuda.empty_cache()

    vllm = VLLMGenerator(str(model_dir), tok, max_lora_rank=LORA_R, gpu_memory_utilization=memory_fraction,
                         max_model_len=4096)
    vllm.set_adapter(adapter)
    vllm.generate(prompts[:2], 8)  # warm-up (CUDA graphs, the adapter's first load)
    outs, vllm_s = timed(lambda: vllm.generate(prompts, new_tokens, temperature=1.0))
    vllm_tokens = sum(o.completion_tokens for o in outs)
    del vllm
    torch.cuda.empty_cache()
    return {"prompts": n, "prompt_tokens_mean": sum(map(len, prompts)) / n, "new_tokens_asked": new_tokens,
            "hf": {"tokens": hf_tokens, "seconds": hf_s, "tokens_per_s": hf_tokens / hf_s},
            "vllm": {"tokens": vllm_tokens, "seconds": vllm_s, "tokens_per_s": vllm_tokens / vllm_s},
            "ratio": (vllm_tokens / vllm_s) / (hf_tokens / hf_s)}


def rl_step(model_dir: Path, adapter: Path, out: Path, memory_fraction: float) -> dict:
    import torch

    from coa_lab.config import get_preset
    from coa_lab.rl.trainer import train_rl
    from coa_lab.tasks.records import Task
    from coa_lab.tools.registry import build_tools

    preset = get_preset("gpu-3b-qlora", model={"name": str(model_dir), "use_unsloth": False, "load_in_4bit": False},
                        gen={"backend": "vllm", "vllm_memory_fraction": memory_fraction, "max_new_tokens": 256,
                             "max_response_tokens": 512, "max_turns": 2},
                        # random weights solve nothing: keep every group so the step updates and pushes
                        rl={"steps": 1, "prompts_per_step": 4, "group_size": 8, "dynamic_sampling": False,
                            "max_sampling_rounds": 0, "anchors_per_step": 0, "overlong_buffer": 128})
    tasks = [Task(f"m{i}", f"What is {1000 + 37 * i} * {17 + i}?", [str((1000 + 37 * i) * (17 + i))], "bench",
                  "math", {}) for i in range(8)]
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    result = train_rl(preset, tasks, build_tools(["code"]), out, adapter=adapter)
    row = result.metrics[0]
    pushed = sorted(p.name for p in (out / "sampler").glob("step*"))
    return {"seconds": time.perf_counter() - t0, "peak_trainer_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
            "metrics": row, "pushed_adapters": pushed}


def main() -> None:
    import torch
    import transformers
    from transformers import AutoTokenizer

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model-dir", type=Path, default=Path("/tmp/qwen25-3b-random"))
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--memory-fraction", type=float, default=0.5)
    args = p.parse_args()
    assert torch.cuda.is_available(), "this script measures the GPU path; run it on a CUDA machine"
    args.out.mkdir(parents=True, exist_ok=True)
    import vllm

    results = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                            "vllm": vllm.__version__, "gpu": torch.cuda.get_device_name(0)}}
    print(json.dumps(results), flush=True)
    model_dir = build_random_model(args.tokenizer, args.model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)

    from coa_lab.config import ModelConfig
    from coa_lab.generation.models import load_model

    adapter = args.out / "adapter"
    policy, _ = load_model(ModelConfig(name=str(model_dir), dtype="bfloat16", lora_r=LORA_R, lora_alpha=2 * LORA_R),
                           trainable=True)
    policy.save_pretrained(adapter)
    del policy
    torch.cuda.empty_cache()

    results["throughput"] = throughput(model_dir, adapter, tok, args.prompts, args.new_tokens, args.memory_fraction)
    print(json.dumps(results["throughput"]), flush=True)
    (args.out / "gpu_vllm.json").write_text(json.dumps(results, indent=2))
    results["rl_step"] = rl_step(model_dir, adapter, args.out / "rl", args.memory_fraction)
    print(json.dumps(results["rl_step"], default=str), flush=True)
    (args.out / "gpu_vllm.json").write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
