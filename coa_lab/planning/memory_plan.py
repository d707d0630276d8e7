"""Per-GPU memory for a preset, from the model's shape: what a course needs to size hardware
(`coa-lab plan --preset P --gpus N`; docs/scaling.md). Time per step is coa_lab/planning/step_time.py,
both against the real GPU runs and as the CLI prints them coa_lab/planning/plan_report.py.

Every term is a formula you can check by hand (tests/planning/test_memory_plan.py does):

    weights      params x bytes per weight (4-bit QLoRA: 0.5 B for the layers' linear weights,
                 the embeddings stay in 16-bit)
    trainable    LoRA: layers x r x (in + out) summed over the target modules; full: all params
    gradients    trainable x bytes of the training dtype
    optimizer    AdamW: 2 fp32 states per trainable parameter, plus an fp32 master copy when the
                 weights train in 16-bit (full fine-tuning)
    activations  per layer, for micro-batch b and length s: 34 s b h bytes in 16-bit (Korthikanti
                 et al. 2022, flash attention: no s^2 term); with gradient checkpointing only each
                 layer's input is kept (2 s b h), plus what one layer's backward holds while it
                 recomputes: RECOMPUTE_BYTES s b h, measured (not Korthikanti's 34: a LoRA'd
                 SwiGLU layer at 5.4 h, its gradients and temporaries alive at once)
    logits       c V x (2 + 4 + 4) bytes in 16-bit (the logits, their fp32 upcast for the loss,
                 and its fp32 gradient), c V x 8 in fp32, with c = min(b s, lm_head.CHUNK): the
                 LM head runs a chunk of positions at a time and recomputes it in the backward
                 (coa_lab/training/lm_head.py). Unchunked (c = b s, `logits_chunk=None`, what the lab did
                 before chunking, and what sharded full fine-tunes still do: ZeRO-3/FSDP gather
                 the head's weights inside their own forward only) this is the largest activation
                 of a long sequence: 46 GiB at 4 x 8,192 positions over a 152k vocabulary
    kv cache     rollouts: 2 (K and V) x layers x kv_heads x head_dim x 2 bytes per token, for
                 gen.batch_size sequences of prompt + max_response_tokens, or as many as
                 gen.kv_budget_gib holds (generation/backends.rows_for_budget, what the decoder uses)
    sampler      an in-process vLLM engine's own copy of the weights: params x bytes of the preset's
                 dtype, 2 for 4-bit QLoRA too (the lab passes vLLM no quantization); beside the
                 trainer during RL
    engine alone capture and evaluation have no trainer on the card: the engine's share is its
                 weights + gen.batch_size full-length rows of KV, x MEMORY_MARGIN, at most
                 ALONE_SHARE_CAP of the card, and it decodes the rows that share holds (engine_alone)

Sharding over N GPUs: ZeRO-3 / FSDP divides weights, gradients and optimizer states by N; LoRA runs
(ZeRO-2 / DDP) divide the gradients and optimizer states only. Activations, logits and the KV cache
are per GPU. These are estimates: allocator fragmentation, CUDA context (~0.5 GiB) and framework
buffers come on top; against the measured H100 and H200 peaks (plan_report.VALIDATION_RUNS) plan() ran
from 22% low to 28% high (`calibration()`), so `fit_verdict` asks for MEMORY_MARGIN on top.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from coa_lab.config import ModelConfig, Preset
from coa_lab.generation.backends import rows_for_budget
from coa_lab.generation.engine_share import (GIB, IN_PROCESS_ENGINE, MEMORY_MARGIN, engine_weight_bytes, row_bytes,
                                             share_beside_trainer)
from coa_lab.generation.model_shape import ModelShape, params_named, shape_of
from coa_lab.training.lm_head import CHUNK

# The model's shape (KNOWN_SHAPES, shape_of) is generation/model_shape.py; what an in-process vLLM
# engine loads and its share of the card, generation/engine_share.py: the stages size it there too.


def lora_params(shape: ModelShape, r: int, targets) -> int:
    """r x (in + out) per adapted module (A: r x in, B: out x r), over all layers."""
    lin = shape.linear_shapes()
    return shape.layers * sum(r * (lin[t][0] + lin[t][1]) for t in targets)


def weight_bytes(m: ModelConfig, shape: ModelShape, n: int) -> float:
    """Bytes of the trainer's copy of the weights (unsharded) in the preset's dtype / quantization."""
    if m.load_in_4bit:  # bitsandbytes 4-bit: QLoRA's layout, the one vLLM's in-flight 4-bit loads too
        return engine_weight_bytes(m, shape, n, "bitsandbytes")
    return n * (2 if m.dtype in ("bfloat16", "float16") else 4)


def rollout_weight_bytes(preset: Preset, shape: ModelShape, n: int) -> float:
    """The weights one decode step reads: an in-process engine's own copy (IN_PROCESS_ENGINE), else
    the policy's (the lab's decoder samples the trainer's model)."""
    if preset.gen.backend in IN_PROCESS_ENGINE:
        return engine_weight_bytes(preset.model, shape, n)
    return weight_bytes(preset.model, shape, n)


def trainable_params(m: ModelConfig, shape: ModelShape, n: int) -> int:
    """All n parameters for a full fine-tune (lora_r == 0), else the LoRA adapter's."""
    return n if m.lora_r == 0 else lora_params(shape, m.lora_r, m.target_modules)


def params_of(preset: Preset, shape: ModelShape) -> int:
    """The parameter count plan() uses: Qwen2 models carry q/k/v biases."""
    return params_named(preset.model.name, shape)


@dataclass
class MemoryPlan:
    params: int
    trainable: int
    weights_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float  # with the preset's gradient-checkpointing setting
    activations_no_ckpt_gib: float
    activations_ckpt_gib: float
    logits_gib: float
    kv_per_sequence_mib: float  # one rollout at full length (prompt + max_response_tokens)
    rollout_batch: int  # rows decoded at once: gen.batch_size, or what gen.kv_budget_gib holds
    kv_cache_gib: float  # rollout_batch of them at once: the worst case (vLLM pages and queues the rest)
    # what the sampler holds: an in-process vLLM engine its own copy (engine_weight_bytes: 16-bit),
    # the lab's decoder the trainer's weights
    rollout_weights_gib: float
    train_total_gib: float  # weights + gradients + optimizer + activations + logits
    rollout_total_gib: float  # rollout weights + KV cache

    def to_dict(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


# Bytes per position per hidden unit that one layer's backward holds under gradient checkpointing,
# fitted to the H200 run of 2026-11-26 (docs/gpu-validation.md; the chunked LM head, so the peak is
# the layers'): SFT at 4k and 8k needed 203 and 181, the DAPO update's micro-batches of 4 x 4k and
# 4 x 8k 240 and 299 (padded rows: an s^2 share the planner does not model). 200 puts the SFT
# peaks within 4% and the DAPO update's 9% and 22% under: inside MEMORY_MARGIN. Korthikanti's 34
# had planned 6.3 GiB for an 8.6 GiB SFT step and 11.3 GiB for a 27.9 GiB update.
RECOMPUTE_BYTES = 200


def plan(preset: Preset, gpus: int = 1, shape: ModelShape | None = None,
         logits_chunk: int | None = CHUNK) -> MemoryPlan:
    """Per-GPU memory of the preset's SFT/RL training step and of its rollouts, on `gpus` GPUs.
    logits_chunk: positions the LM head projects at once (None: all of them, the unchunked path)."""
    if gpus < 1:
        raise ValueError("gpus must be >= 1")
    m = preset.model
    shape = shape or shape_of(m.name)
    n = params_of(preset, shape)
    half = m.dtype in ("bfloat16", "float16")
    wbytes = 2 if half else 4
    weights = weight_bytes(m, shape, n)
    full = m.lora_r == 0
    trainable = trainable_params(m, shape, n)
    grads = trainable * (wbytes if full else 4)  # LoRA weights train in fp32
    optimizer = trainable * 8 + (trainable * 4 if full and half else 0)
    if full:  # ZeRO-3 / FSDP: everything sharded
        weights, grads, optimizer = weights / gpus, grads / gpus, optimizer / gpus
    else:  # LoRA: the frozen base is replicated, the adapter's gradients and states sharded
        grads, optimizer = grads / gpus, optimizer / gpus
    b, s, h = preset.sft.batch_size, preset.sft.max_length, shape.hidden
    act_full = shape.layers * 34 * s * b * h
    act_ckpt = shape.layers * 2 * s * b * h + RECOMPUTE_BYTES * s * b * h
    activations = act_ckpt if m.gradient_checkpointing else act_full
    # sharded full fine-tunes (ZeRO-3 / FSDP over several GPUs) keep the unchunked head (lm_head.nll_at)
    sharded = full and gpus > 1
    positions = b * s if logits_chunk is None or sharded else min(b * s, logits_chunk)
    logits = positions * shape.vocab * (2 + 4 + 4 if half else 4 + 4)
    g = preset.gen
    kv_sequence = row_bytes(preset, shape)  # one full-length row: a typical prompt + max_response_tokens
    rows = rows_for_budget(g, kv_sequence)  # the decoder sizes its batch the same way (generation/backends.py)
    kv = kv_sequence * rows
    # an in-process engine loads its own 16-bit copy; the lab's decoder (and a vLLM server, on its
    # own node) leaves the trainer's card the policy's weights alone
    rollout_weights = engine_weight_bytes(m, shape, n) if g.backend in IN_PROCESS_ENGINE else weights
    train = weights + grads + optimizer + activations + logits
    return MemoryPlan(
        params=n, trainable=trainable, weights_gib=weights / GIB, gradients_gib=grads / GIB,
        optimizer_gib=optimizer / GIB, activations_gib=activations / GIB, activations_no_ckpt_gib=act_full / GIB,
        activations_ckpt_gib=act_ckpt / GIB, logits_gib=logits / GIB, kv_per_sequence_mib=kv_sequence / 1024**2,
        rollout_batch=rows, kv_cache_gib=kv / GIB, rollout_weights_gib=rollout_weights / GIB,
        train_total_gib=train / GIB, rollout_total_gib=(rollout_weights + kv) / GIB,
    )


# --- does it fit -----------------------------------------------------------------------------

# plan() ran up to 22% under the measured H100 and H200 peaks (calibration(): ratios 0.78-1.28; the
# worst peak, the DAPO update at 4 x 8k, was 1.29x its plan), so a plan "fits" only with that
# error, MEMORY_MARGIN (generation/engine_share.py), on top; one that fits the GPU but not with it is "tight".


def rl_on_one_card(memory: MemoryPlan, memory_gib: float) -> dict:
    """An in-process vLLM engine holds its weights and KV cache while the trainer holds the policy,
    its optimizer and activations, on the same card during RL: the two must fit together. The
    engine's share of the card (vLLM's gpu_memory_utilization) is the rollout side's planned need
    with the margin, within [0.1, 0.9]: engine_share.share_beside_trainer, what RL's stage asks for."""
    together = memory.train_total_gib + memory.rollout_total_gib
    return {"rl_together": fit_verdict(together, memory_gib), "together_gib": round(together, 2),
            "vllm_memory_fraction": share_beside_trainer(memory.rollout_total_gib, memory_gib)}


def rl_fit_warning(preset: Preset, card_gib: float) -> str | None:
    """What `coa-lab rl` and `coa-lab demo` print before they start where RL's trainer and an
    in-process vLLM engine will not fit on this card with the margin (None where they fit, the
    engine is not in-process, the share is set by hand, or the model's shape is unknown)."""
    if preset.gen.vllm_memory_fraction is not None or preset.gen.backend not in IN_PROCESS_ENGINE:
        return None
    try:
        together = rl_on_one_card(plan(preset, 1, shape_of(preset.model.name)), card_gib)
    except ValueError:
        return None
    if together["rl_together"] == "fits":
        return None
    verdict = "is tight" if together["rl_together"] == "tight" else "does not fit"
    return (f"RL with in-process vLLM {verdict} on this {card_gib:.0f} GiB card ({together['together_gib']} GiB "
            f"planned for trainer and sampler, x{MEMORY_MARGIN} margin): `coa-lab plan --preset {preset.name}` "
            "has the breakdown")


def fit_verdict(total_gib: float, memory_gib: float) -> str:
    if total_gib * MEMORY_MARGIN <= memory_gib:
        return "fits"
    return "tight" if total_gib <= memory_gib else "does not fit"
