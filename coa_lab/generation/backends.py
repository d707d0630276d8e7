"""Which backend samples, and how many rows it decodes at once.

- gen.backend "auto": vLLM where it is installed and a GPU is present (the fast path), else the
  lab's own batched decoder (generation/decoding.py) on whatever device the model is on. One GPU
  without vLLM is then a working setup, not an import error.
- gen.kv_budget_gib: the rollout batch from a KV-cache budget rather than a fixed count. A row
  at full length (a typical prompt + gen.max_response_tokens) holds
  2 x layers x kv_heads x head_dim x bytes per value; as many rows as fit in the budget are
  decoded together, at most gen.batch_size. The planner (`coa-lab plan`) sizes the same way, so
  the KV cache it prints is the one the run allocates at most.
"""

from __future__ import annotations

import importlib.util

PROMPT_TOKENS = 512  # a typical prompt: a full-length row is this + gen.max_response_tokens


def resolve_backend(backend: str) -> str:
    """"auto" -> "vllm" when the vllm package and a CUDA device are both present, else "hf";
    any other name is returned as it is."""
    if backend != "auto":
        return backend
    if importlib.util.find_spec("vllm") is None:
        return "hf"
    import torch  # late: `coa-lab plan` imports this module and runs without torch

    return "vllm" if torch.cuda.is_available() else "hf"


def rows_for_budget(gen, kv_bytes_per_row: int) -> int:
    """Rows decoded at once: gen.batch_size, or fewer when gen.kv_budget_gib cannot hold that many
    full-length rows (never fewer than 1)."""
    budget = getattr(gen, "kv_budget_gib", None)
    if budget is None:
        return gen.batch_size
    if budget <= 0:
        raise ValueError(f"gen.kv_budget_gib must be > 0 GiB, got {budget!r}")
    return max(1, min(gen.batch_size, int(budget * 1024**3 // max(1, kv_bytes_per_row))))


def rollout_batch(gen, model) -> int:
    """`rows_for_budget` for a loaded transformers model, its KV bytes per row read from its config
    and the dtype its cache is kept in (the model's parameters')."""
    if getattr(gen, "kv_budget_gib", None) is None:
        return gen.batch_size
    cfg = model.config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    # a 4-bit model's packed weights report 1 byte, but its activations and cache are 16-bit
    value_bytes = max(2, next(model.parameters()).element_size())
    per_token = 2 * cfg.num_hidden_layers * kv_heads * head_dim * value_bytes  # K and V, every layer
    return rows_for_budget(gen, per_token * (PROMPT_TOKENS + gen.max_response_tokens))
