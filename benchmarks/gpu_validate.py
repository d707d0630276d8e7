"""Prove the GPU paths through the SAME coa_lab functions the CPU demo uses.

Run on a CUDA machine (see docs/gpu-validation.md for the recorded results):

    python benchmarks/gpu_validate.py --tokenizer DIR --out OUTDIR [--contexts 4096 8192]

Weights do not matter for speed and memory, and the GPU machine has no model hub, so the
model is the Qwen2.5-3B architecture with random weights, with the embedded SmolLM2
tokenizer files for token ids (all ids fall inside Qwen's larger vocabulary).

1. 4-bit QLoRA SFT (coa_lab.sft.train_sft, preset gpu-3b-qlora): peak memory, tokens/s,
   at each context length; the same run with bf16 LoRA (no quantization) for the ratio.
2. One DAPO update (coa_lab.rl.update.policy_update) at group size 8: peak memory, seconds.
3. Batched rollout generation (coa_lab.generation.hf_generator.HFGenerator): tokens/s.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

QWEN25_3B = dict(  # the published Qwen2.5-3B architecture numbers
    vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
    num_attention_heads=16, num_key_value_heads=2, max_position_embeddings=32768,
    rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
)


def build_random_model(tokenizer_dir: Path, target: Path) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if (target / "config.json").exists():
        return target
    config = Qwen2Config(**QWEN25_3B, torch_dtype="bfloat16")
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(target)
    for f in tokenizer_dir.iterdir():
        if f.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            shutil.copy(f, target / f.name)
    del model
    torch.cuda.empty_cache()
    return target


def long_records(tokenizer, n: int, context: int):
    """Real CoA trajectories (shipped FireAct runs) concatenated to fill `context` tokens."""
    from coa_lab.distill.importers import load_imported
    from coa_lab.paths import DATASETS_DIR
    from coa_lab.trajectories import TrajectoryRecord

    pool = load_imported(DATASETS_DIR / "trajectories" / "fireact_hotpotqa_react.jsonl")
    out = []
    for i in range(n):
        parts, total = [], 0
        while total < context - 400:
            t = pool[(i * 7 + len(parts)) % len(pool)].text
            parts.append(t.rsplit("<answer>", 1)[0])
            total += len(tokenizer(t, add_special_tokens=False)["input_ids"])
        text = "\n".join(parts) + "<answer>done</answer>"
        out.append(TrajectoryRecord(f"r{i}", f"r{i}", "bench", "mhqa", "benchmark question", ["done"], text))
    return out


def sft_run(model_dir: Path, tokenizer, context: int, four_bit: bool, out: Path, steps: int) -> dict:
    import torch

    from coa_lab.config import get_preset
    from coa_lab.sft import train_sft

    preset = get_preset("gpu-3b-qlora", model={"name": str(model_dir), "use_unsloth": False, "load_in_4bit": four_bit},
                        sft={"max_length": context, "epochs": 1, "batch_size": 1, "grad_accum": 1})
    records = long_records(tokenizer, steps, context)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    res = train_sft(preset, records, out)
    return {"context": context, "four_bit": four_bit, "steps": len(res.losses), "loss_first": res.losses[0],
            "loss_last": res.losses[-1], "train_seconds": res.train_seconds,
            "tokens_per_s": res.total_tokens / max(res.train_seconds, 1e-9),
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
            "masked_observation_tokens": res.masked_observation_tokens}


def dapo_run(model_dir: Path, prompt_len: int, response_len: int, four_bit: bool = True) -> dict:
    import torch

    from coa_lab.agents.coa_runner import Rollout
    from coa_lab.config import get_preset
    from coa_lab.generation.models import load_model
    from coa_lab.rl.update import policy_update

    preset = get_preset("gpu-3b-qlora", model={"name": str(model_dir), "use_unsloth": False, "load_in_4bit": four_bit})
    model, tok = load_model(preset.model, trainable=True)
    rng = random.Random(0)
    group = []
    for g in range(preset.rl.group_size):
        r = Rollout(task=None, prompt_ids=[rng.randrange(1000, 40000) for _ in range(prompt_len)])
        r.response_ids = [rng.randrange(1000, 40000) for _ in range(response_len)]
        # a 256-token observation in the middle, as a tool result would be
        r.response_mask = [1] * response_len
        r.response_mask[response_len // 2 : response_len // 2 + 256] = [0] * 256
        group.append(r)
    rewards = [[1.0 if g % 3 == 0 else 0.0 for g in range(preset.rl.group_size)]]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=preset.rl.learning_rate)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    stats = policy_update(model, opt, [group], rewards, preset, tok.pad_token_id)
    torch.cuda.synchronize()
    seconds = time.time() - t0
    result = {"four_bit": four_bit, "group_size": preset.rl.group_size, "prompt_len": prompt_len, "response_len": response_len,
              "seconds": seconds, "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30, **stats}
    gen = generation_run(model, tok)
    del model, opt
    torch.cuda.empty_cache()
    return {"dapo": result, "generation": gen}


def generation_run(model, tok, batch: int = 8, new_tokens: int = 256) -> dict:
    import torch

    from coa_lab.generation.chat_prompt import chat_prompt_ids
    from coa_lab.generation.hf_generator import HFGenerator

    gen = HFGenerator(model, tok, batch_size=batch)
    prompts = [chat_prompt_ids(tok, [{"role": "user", "content": f"Question {i}: what is {i} + {i}?"}]) for i in range(batch)]
    gen.generate(prompts[:1], max_new_tokens=8)  # warm-up
    torch.cuda.synchronize()
    t0 = time.time()
    outs = gen.generate(prompts, max_new_tokens=new_tokens, temperature=1.0)
    torch.cuda.synchronize()
    seconds = time.time() - t0
    produced = sum(o.completion_tokens for o in outs)
    return {"backend": "hf", "batch": batch, "new_tokens": produced, "seconds": seconds, "tokens_per_s": produced / seconds}


def main() -> None:
    import torch
    import transformers

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokenizer", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model-dir", type=Path, default=Path("/tmp/qwen25-3b-random"))
    p.add_argument("--contexts", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    assert torch.cuda.is_available(), "this script proves the GPU path; run it on a CUDA machine"
    args.out.mkdir(parents=True, exist_ok=True)
    from transformers import AutoTokenizer

    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "gpu": torch.cuda.get_device_name(0)}
    for name in ("peft", "bitsandbytes", "unsloth", "vllm"):
        try:
            versions[name] = __import__(name).__version__
        except Exception as exc:  # noqa: BLE001 - record why, keep going
            versions[name] = f"not available ({type(exc).__name__})"
    print(json.dumps(versions), flush=True)
    t0 = time.time()
    model_dir = build_random_model(args.tokenizer, args.model_dir)
    results = {"versions": versions, "build_seconds": time.time() - t0, "sft": [], "rl": None}
    tok = AutoTokenizer.from_pretrained(model_dir)
    # warm-up (CUDA context, kernel autotuning): not recorded
    sft_run(model_dir, tok, 1024, True, args.out / "sft_warmup", 1)
    for ctx in args.contexts:
        for four_bit in (True, False):
            r = sft_run(model_dir, tok, ctx, four_bit, args.out / f"sft_{ctx}_{int(four_bit)}", args.steps)
            print(json.dumps(r), flush=True)
            results["sft"].append(r)
            (args.out / "gpu_validation.json").write_text(json.dumps(results, indent=2))
    results["rl"] = [dapo_run(model_dir, prompt_len=512, response_len=2048, four_bit=fb) for fb in (True, False)]
    print(json.dumps(results["rl"]), flush=True)
    (args.out / "gpu_validation.json").write_text(json.dumps(results, indent=2))
    for d in args.out.glob("sft_*"):
        shutil.rmtree(d, ignore_errors=True)  # adapters are not results


if __name__ == "__main__":
    main()
