"""Generation backends behind one small interface, and the one a preset asks for.

    gen = HFGenerator(model, tokenizer)            # CPU / any GPU: coa_lab.generation.decoding over any HF model
    gen = VLLMGenerator(model_path)                # GPU extra: vLLM engine
    gen = VLLMServerGenerator(base_url, tokenizer) # a separate `vllm serve` (its own node, LoRA hot loading)
    gen = OpenAIChatBackend(base_url, model)       # any OpenAI-compatible server (coa_lab/generation/openai_backend.py)

Each lives in its own module (hf_generator.py, vllm_engine.py, vllm_server.py,
openai_backend.py); every one returns `Generation`s (result.py). This module loads the model
a preset names and builds its backend: `make_generator` (sampling, evaluation, the teacher)
and `rl_sampler` (RL's separate vLLM sampler).
"""

from __future__ import annotations

import dataclasses

import torch

from coa_lab.generation.backends import resolve_backend, rollout_batch
from coa_lab.generation.hf_generator import HFGenerator
from coa_lab.generation.models import (compute_context, cpu_autocast_enabled, effective_dtype, is_full_model_dir,
                                       load_model, load_tokenizer, resolve_model)
from coa_lab.generation.vllm_engine import VLLMGenerator
from coa_lab.generation.vllm_server import VLLMServerGenerator


def make_generator(preset, adapter=None, model_name: str | None = None, keep_prefixes: bool = False):
    """The preset's generation backend: "hf" (transformers, any device), "vllm" (GPU extra),
    "vllm-server" (a separate `vllm serve` at gen.server_url; the adapter is pushed to it) or
    "auto" (vLLM where installed with a GPU, else "hf"). The "hf" decoder takes
    gen.batch_size rows at once, or what gen.kv_budget_gib holds (generation/backends.py).

    adapter: a LoRA adapter directory (SFT/RL output) to sample from; model_name: another
    model than the preset's (a stronger teacher, say); keep_prefixes: "hf" keeps shared prompt
    prefixes' K/V across calls (the teacher's; vLLM has its own prefix caching)."""
    cfg = preset.model if model_name is None else dataclasses.replace(preset.model, name=model_name, use_unsloth=False)
    cfg, adapter = _full_model_as_base(cfg, adapter)
    backend = resolve_backend(preset.gen.backend)
    if backend == "vllm":
        gen = VLLMGenerator(resolve_model(cfg.name), load_tokenizer(cfg.name), max_lora_rank=max(cfg.lora_r, 8),
                            gpu_memory_utilization=vllm_share(preset), dtype=engine_dtype(cfg))
        gen.set_adapter(adapter)
        return gen
    if backend == "vllm-server":
        gen = VLLMServerGenerator(_server_url(preset), load_tokenizer(cfg.name), model=model_name,
                                  api_key_env=preset.gen.server_api_key_env)
        gen.set_adapter(adapter)
        return gen
    if backend != "hf":
        raise ValueError(f"unknown generation backend {preset.gen.backend!r}; use 'hf', 'vllm', 'vllm-server' or 'auto'")
    model, tokenizer = load_model(cfg, adapter=adapter)
    return HFGenerator(model, tokenizer, rollout_batch(preset.gen, model), compute=lambda: compute_context(model, cfg),
                       keep_prefixes=keep_prefixes)


def vllm_share(preset) -> float:
    """The in-process engine's share of the GPU: gen.vllm_memory_fraction. The pipeline's stages
    fill it from the model on this card when the preset leaves it None (engine_share.py); a
    caller that builds a generator directly from such a preset gets 0.5."""
    return 0.5 if preset.gen.vllm_memory_fraction is None else preset.gen.vllm_memory_fraction


def engine_dtype(cfg) -> str:
    """The dtype vLLM computes in: the one the lab's own forwards use, so sampler and trainer score
    the same numbers. vLLM's "auto" would not: it runs an fp32 checkpoint (the embedded model) in
    bf16 or fp16. On a GPU the preset's dtype (fp16 on a card without bf16); on a CPU bf16 where the
    lab autocasts to it (models.cpu_autocast_enabled), else fp32."""
    if torch.cuda.is_available():
        return effective_dtype(cfg)
    return "bfloat16" if cpu_autocast_enabled(cfg) else "float32"


def _full_model_as_base(cfg, adapter):
    """A full fine-tune's output where an adapter would go (the 32B recipe's SFT) is the base
    model itself: sample from it with no adapter (a vLLM server already serves it as its base)."""
    if adapter is not None and is_full_model_dir(adapter):
        return dataclasses.replace(cfg, name=str(adapter)), None
    return cfg, adapter


def _server_url(preset) -> str:
    url = getattr(preset.gen, "server_url", None)
    if not url:
        raise ValueError("gen.backend='vllm-server' needs gen.server_url: the vLLM server's OpenAI-compatible base "
                         "URL, e.g. --set gen.server_url=http://sampler-node:8000/v1 (docs/vllm-server.md)")
    return url


def rl_sampler(preset, tokenizer, adapter):
    """The RL sampler for gen.backend "vllm" (in-process engine) or "vllm-server" (a separate
    `vllm serve` at gen.server_url, key from $gen.server_api_key_env): it samples from the base
    weights plus a LoRA adapter, and `set_adapter(dir)` is called by the trainer after every
    update (the server must read `dir` on a shared filesystem). Full fine-tuning (lora_r == 0)
    would need the new weights broadcast into the engine, which this lab does not implement
    (docs/scaling.md): use gen.backend='hf' for it."""
    if preset.model.lora_r == 0:
        raise ValueError("RL with vLLM sampling needs a LoRA policy (model.lora_r > 0); "
                         "for full fine-tuning set gen.backend='hf'")
    cfg, adapter = _full_model_as_base(preset.model, adapter)
    backend = resolve_backend(preset.gen.backend)
    if backend == "vllm-server":
        gen = VLLMServerGenerator(_server_url(preset), tokenizer, api_key_env=preset.gen.server_api_key_env)
    elif backend == "vllm":
        # the same rank as make_generator's: the same engine settings, so RL shares evaluation's engine
        gen = VLLMGenerator(resolve_model(cfg.name), tokenizer, max_lora_rank=max(preset.model.lora_r, 8),
                            gpu_memory_utilization=vllm_share(preset), dtype=engine_dtype(cfg))
    else:
        raise ValueError(f"no RL sampler for gen.backend={preset.gen.backend!r}; use 'vllm' or 'vllm-server'")
    gen.set_adapter(adapter)
    return gen
