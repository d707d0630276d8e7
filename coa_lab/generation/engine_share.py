"""An in-process vLLM engine's share of the GPU (vLLM's gpu_memory_utilization) when the preset
leaves gen.vllm_memory_fraction None, from the model's shape and this card's memory. The stages
fill it here before they make an engine, and `coa-lab plan` prices the same numbers
(coa_lab/planning/), so the share a run asks for is the one the plan shows.

    beside RL's trainer  the engine's weights + the KV cache of the rows gen.kv_budget_gib holds,
                         x MEMORY_MARGIN, within [0.1, 0.9] of the card (share_beside_trainer)
    alone on the card    capture and evaluation: its weights + gen.batch_size full-length rows,
                         x MEMORY_MARGIN, at most ALONE_SHARE_CAP (engine_alone)

The weights are the ones vLLM loads: the checkpoint in the preset's dtype (16-bit on every GPU
preset), whatever model.load_in_4bit says: that flag quantizes the trainer's copy only, and the
lab passes vLLM no quantization (docs/design.md, "One card holds the plan").

On a machine without a GPU the engine is vLLM's CPU build, which has no card to share: it reads
gpu_memory_utilization as a fraction of the host's memory and, unless told its KV cache's size,
takes that fraction less what its worker already holds (half of a 24 GiB machine: 10.5 GiB of
cache for a 135M model, after a warm-up pass to measure it). The stages tell it the size instead
(cpu_kv_cache_bytes: the same rows as on a GPU, in the cache's dtype, with the margin, at least one
sequence of the model's full context, which vLLM insists on); VLLM_CPU_KVCACHE_SPACE, where the
user sets it, wins.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import warnings
from pathlib import Path

from coa_lab.config import ModelConfig, Preset
from coa_lab.generation.backends import PROMPT_TOKENS, rows_for_budget
from coa_lab.generation.model_shape import ModelShape, params_named, shape_of

GIB = 1024**3
# The planner's measured error: plan() ran from 22% under to 28% over the real H100 and H200 peaks
# (planning.memory_plan.calibration), so an engine asks for its need with this on top
MEMORY_MARGIN = 1.3
# vLLM's own default gpu_memory_utilization: an engine alone on the card still leaves a tenth to the
# CUDA contexts (this process's and vLLM's engine process's) and to the sampler's activations
ALONE_SHARE_CAP = 0.9
# gen.backend values whose rollouts come from a vLLM engine in this process ("auto" is vLLM on a GPU
# where it is installed, what the planner assumes): it holds its own copy of the weights beside the trainer's
IN_PROCESS_ENGINE = ("vllm", "auto")


def engine_weight_bytes(m: ModelConfig, shape: ModelShape, n: int, quantization: str | None = None) -> float:
    """Bytes of the weights an in-process vLLM engine loads: the checkpoint in the preset's dtype
    without `quantization`; "bitsandbytes" prices vLLM's own in-flight 4-bit (QLoRA's layout:
    the layers' linear weights in 4 bits, embeddings and norms in 16-bit)."""
    if quantization is None:
        return n * (2 if m.dtype in ("bfloat16", "float16") else 4)
    if quantization == "bitsandbytes":
        linear = shape.layers * shape.layer_linear_params()
        return linear * 0.5 + (n - linear) * 2
    raise ValueError(f"no weight size known for vLLM quantization {quantization!r}; None or 'bitsandbytes'")


def kv_bytes_per_token(shape: ModelShape) -> int:
    """K and V, every layer, every KV head, 2 bytes each (16-bit cache)."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * 2


def row_bytes(preset: Preset, shape: ModelShape) -> int:
    """The KV cache of one full-length row: a typical prompt + gen.max_response_tokens."""
    return kv_bytes_per_token(shape) * (preset.gen.max_response_tokens + PROMPT_TOKENS)


def beside_trainer_bytes(preset: Preset, shape: ModelShape) -> float:
    """What an engine beside RL's trainer holds: its weights and the KV cache of the rows
    gen.kv_budget_gib holds (rows_for_budget, as the decoder and the planner count them)."""
    row = row_bytes(preset, shape)
    weights = engine_weight_bytes(preset.model, shape, params_named(preset.model.name, shape))
    return weights + row * rows_for_budget(preset.gen, row)


def share_beside_trainer(need_gib: float, card_gib: float) -> float:
    """The engine's share of a card beside RL's trainer: its need with the margin, within [0.1, 0.9]."""
    return round(min(0.9, max(0.1, need_gib * MEMORY_MARGIN / card_gib)), 2)


def engine_alone(preset: Preset, memory_gib: float, model_name: str | None = None,
                 shape: ModelShape | None = None) -> dict:
    """An in-process vLLM engine with the card to itself: capture and evaluation, where no trainer
    sits beside it (pipeline._free_the_card runs before SFT, RL and evaluation). Its share is its
    16-bit weights and gen.batch_size full-length rows of KV with the margin, at most
    ALONE_SHARE_CAP; `rows` is what that share holds with the margin (the planner's capture and
    evaluation decode with it; RL's share keeps gen.kv_budget_gib, a trainer beside it).
    model_name: the engine's model where it is not the preset's (capture.teacher_model)."""
    name = model_name or preset.model.name
    shape = shape or shape_of(name)
    weights = engine_weight_bytes(preset.model, shape, params_named(name, shape))
    row = row_bytes(preset, shape)
    card = memory_gib * GIB
    want = (weights + preset.gen.batch_size * row) * MEMORY_MARGIN / card
    # rounded up, so the share's rows are never one short of what was asked for
    share = min(ALONE_SHARE_CAP, max(0.1, math.ceil(want * 100) / 100))
    # at least one row: a model whose weights alone overflow the share is reported as such elsewhere
    # (plan_report's teacher line), and its decode is still priced
    rows = max(1, min(preset.gen.batch_size, int((share * card / MEMORY_MARGIN - weights) // row)))
    return {"vllm_memory_fraction": share, "rows": rows, "weights_gib": round(weights / GIB, 3),
            "kv_cache_gib": round(rows * row / GIB, 3)}


def _card_gib() -> float:
    """This process's GPU 0 in GiB (raises where there is none)."""
    import torch  # late: `coa-lab plan` imports this module and stays without torch

    return torch.cuda.get_device_properties(0).total_memory / GIB


def _with_share(preset: Preset, share_of_card, what: str) -> Preset:
    """The preset with gen.vllm_memory_fraction = share_of_card(card GiB), when it is None and a GPU
    answers; unchanged where the fraction is set (the user's choice) or the model's shape is unknown
    (the engine then takes 0.5, llm.vllm_share)."""
    if preset.gen.vllm_memory_fraction is not None:
        return preset
    try:
        share = share_of_card(_card_gib())
    except (ValueError, RuntimeError, AssertionError) as exc:
        import torch  # late: as _card_gib

        if torch.cuda.is_available():  # vLLM's CPU build has no share: its cache is VLLM_CPU_KVCACHE_SPACE
            warnings.warn(f"vLLM's share of the GPU{what}: none computed ({exc}); 0.5 (set gen.vllm_memory_fraction)",
                          stacklevel=3)
        return preset
    return dataclasses.replace(preset, gen=dataclasses.replace(preset.gen, vllm_memory_fraction=share))


def with_engine_share(preset: Preset) -> Preset:
    """RL: gen.vllm_memory_fraction for an engine beside the trainer on this card
    (share_beside_trainer). Whether trainer and engine fit together is the planner's verdict
    (`coa-lab plan`: planning.memory_plan.rl_on_one_card)."""
    return _with_share(preset, lambda card: share_beside_trainer(
        beside_trainer_bytes(preset, shape_of(preset.model.name)) / GIB, card), "")


def with_engine_alone(preset: Preset, model_name: str | None = None) -> Preset:
    """Capture and evaluation: gen.vllm_memory_fraction for an engine alone on this card
    (engine_alone). model_name: the engine's model where not the preset's (a local teacher)."""
    return _with_share(preset, lambda card: engine_alone(preset, card, model_name)["vllm_memory_fraction"], " alone")


def _max_positions(model_name: str) -> int | None:
    """The model's full context (config.json's max_position_embeddings): the longest sequence vLLM
    makes room for by default; None where no local config says."""
    from coa_lab.generation.models import resolve_model  # late: as _card_gib

    for folder in (Path(model_name), Path(resolve_model(model_name))):
        config = folder / "config.json"
        if config.exists():
            return json.loads(config.read_text()).get("max_position_embeddings")
    return None


def cpu_kv_cache_bytes(preset: Preset, alone: bool, model_name: str | None = None) -> int | None:
    """vLLM's CPU build: bytes of KV cache for this stage's engine (its kv_cache_memory_bytes), or
    None where there is a GPU (its share is gen.vllm_memory_fraction) or VLLM_CPU_KVCACHE_SPACE is
    set (the user's size, which vLLM's CPU build reads over any other). The rows are a GPU's: alone
    (capture, evaluation) gen.batch_size full-length rows, beside RL's trainer what gen.kv_budget_gib
    holds; each value in the dtype the engine computes in (llm.engine_dtype: fp32 unless bf16
    autocast), with MEMORY_MARGIN; at least one sequence of the model's full context with the margin.
    model_name: the engine's model where not the preset's (a local teacher)."""
    import torch  # late: as _card_gib

    if torch.cuda.is_available() or os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return None
    from coa_lab.generation.llm import engine_dtype  # late: it imports the backends and torch

    name = model_name or preset.model.name
    cfg = dataclasses.replace(preset.model, name=name)
    shape = shape_of(name)
    per_token = kv_bytes_per_token(shape) * (2 if engine_dtype(cfg) == "float32" else 1)  # 16-bit -> fp32
    row = per_token * (preset.gen.max_response_tokens + PROMPT_TOKENS)
    rows = preset.gen.batch_size if alone else rows_for_budget(preset.gen, row)
    longest = per_token * (_max_positions(name) or 0)
    return math.ceil(max(rows * row, longest) * MEMORY_MARGIN)


def size_cpu_engine(preset: Preset, alone: bool, model_name: str | None = None) -> int | None:
    """A stage's engine on vLLM's CPU build: its KV cache (cpu_kv_cache_bytes) handed to the engine
    factory (vllm_engine.set_cpu_kv_cache) for this model; returns the bytes, None where nothing is
    sized (a GPU, or VLLM_CPU_KVCACHE_SPACE set)."""
    size = cpu_kv_cache_bytes(preset, alone, model_name)
    if size is not None:
        from coa_lab.generation import vllm_engine  # late: as cpu_kv_cache_bytes
        from coa_lab.generation.models import resolve_model

        vllm_engine.set_cpu_kv_cache(resolve_model(model_name or preset.model.name), size)
    return size
