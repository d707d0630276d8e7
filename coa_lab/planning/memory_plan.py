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

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from coa_lab.config import EMBEDDED_MODEL, ModelConfig, Preset
from coa_lab.generation.backends import PROMPT_TOKENS, rows_for_budget
from coa_lab.training.lm_head import CHUNK

GIB = 1024**3
# PROMPT_TOKENS (generation/backends.py): the typical prompt the rollouts' KV cache and length assume

# Shapes of the presets' models (their config.json), so a plan needs no download and no transformers.
KNOWN_SHAPES = {
    EMBEDDED_MODEL: dict(hidden=576, layers=30, heads=9, kv_heads=3, head_dim=64,  # SmolLM2-135M-Instruct
                         intermediate=1536, vocab=49152, tied=True),
    # colab-t4's student (fp16 on a T4: docs/colab.md), and Unsloth's ungated upload of the same weights
    "meta-llama/Llama-3.2-1B-Instruct": dict(hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64,
                                             intermediate=8192, vocab=128256, tied=True),
    "unsloth/Llama-3.2-1B-Instruct": dict(hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64,
                                          intermediate=8192, vocab=128256, tied=True),
    "Qwen/Qwen2.5-1.5B-Instruct": dict(hidden=1536, layers=28, heads=12, kv_heads=2, head_dim=128,
                                       intermediate=8960, vocab=151936, tied=True),
    "Qwen/Qwen2.5-3B-Instruct": dict(hidden=2048, layers=36, heads=16, kv_heads=2, head_dim=128,
                                     intermediate=11008, vocab=151936, tied=True),
    # larger local teachers for the GPU presets' capture (capture.teacher_model; docs/scaling.md)
    "Qwen/Qwen2.5-7B-Instruct": dict(hidden=3584, layers=28, heads=28, kv_heads=4, head_dim=128,
                                     intermediate=18944, vocab=152064, tied=False),
    "Qwen/Qwen2.5-14B-Instruct": dict(hidden=5120, layers=48, heads=40, kv_heads=8, head_dim=128,
                                      intermediate=13824, vocab=152064, tied=False),
    "Qwen/Qwen2.5-32B-Instruct": dict(hidden=5120, layers=64, heads=40, kv_heads=8, head_dim=128,
                                      intermediate=27648, vocab=152064, tied=False),
}


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool

    @classmethod
    def from_config(cls, cfg: dict) -> "ModelShape":
        heads = cfg["num_attention_heads"]
        return cls(hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"], heads=heads,
                   kv_heads=cfg.get("num_key_value_heads", heads),
                   head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                   intermediate=cfg["intermediate_size"], vocab=cfg["vocab_size"],
                   tied=bool(cfg.get("tie_word_embeddings", False)))

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear module of one decoder layer (Llama / Qwen2 layout)."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        q = self.heads * self.head_dim
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, self.intermediate), "up_proj": (h, self.intermediate),
                "down_proj": (self.intermediate, h)}

    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2)

    def layer_linear_params(self) -> int:
        return sum(i * o for i, o in self.linear_shapes().values())

    def params(self, biases: int = 0) -> int:
        """Every parameter: embeddings (+ untied LM head), linear weights, two RMSNorms per layer
        and the final norm; `biases` adds per-layer bias terms (Qwen2 has q/k/v biases)."""
        norms = self.layers * 2 * self.hidden + self.hidden
        return self.embedding_params() + self.layers * (self.layer_linear_params() + biases) + norms


def shape_of(model_name: str) -> ModelShape:
    """The shape from a local folder's config.json, KNOWN_SHAPES, or the resolved model's config.

    KNOWN_SHAPES comes before resolving: resolving the embedded model converts it (transformers,
    ~20 s) on a fresh machine, and a plan must stay instant anywhere."""
    local = Path(model_name) / "config.json"
    if local.exists():
        return ModelShape.from_config(json.loads(local.read_text()))
    if model_name in KNOWN_SHAPES:
        return ModelShape(**KNOWN_SHAPES[model_name])
    from coa_lab.generation.models import resolve_model

    resolved = Path(resolve_model(model_name)) / "config.json"
    if resolved.exists():
        return ModelShape.from_config(json.loads(resolved.read_text()))
    raise ValueError(f"no shape known for {model_name!r}: pass a local model folder with a config.json, "
                     f"or one of {sorted(KNOWN_SHAPES)}")


def qwen2_biases(shape: ModelShape) -> int:
    """Qwen2's q, k and v projections carry biases: q_out + 2 kv_out per layer."""
    return shape.heads * shape.head_dim + 2 * shape.kv_heads * shape.head_dim


def lora_params(shape: ModelShape, r: int, targets) -> int:
    """r x (in + out) per adapted module (A: r x in, B: out x r), over all layers."""
    lin = shape.linear_shapes()
    return shape.layers * sum(r * (lin[t][0] + lin[t][1]) for t in targets)


def _four_bit_bytes(shape: ModelShape, n: int) -> float:
    """bitsandbytes 4-bit: the layers' linear weights in 4 bits, the rest (embeddings, norms) in 16-bit."""
    linear = shape.layers * shape.layer_linear_params()
    return linear * 0.5 + (n - linear) * 2


def weight_bytes(m: ModelConfig, shape: ModelShape, n: int) -> float:
    """Bytes of the trainer's copy of the weights (unsharded) in the preset's dtype / quantization."""
    if m.load_in_4bit:
        return _four_bit_bytes(shape, n)
    return n * (2 if m.dtype in ("bfloat16", "float16") else 4)


# gen.backend values whose rollouts come from a vLLM engine in this process ("auto" is vLLM on a GPU
# where it is installed, what the planner assumes): it holds its own copy of the weights beside the trainer's
IN_PROCESS_ENGINE = ("vllm", "auto")


def engine_weight_bytes(m: ModelConfig, shape: ModelShape, n: int, quantization: str | None = None) -> float:
    """Bytes of the weights an in-process vLLM engine loads. Without `quantization` vLLM loads the
    checkpoint in the preset's dtype (generation/llm.engine_dtype: 16-bit for every GPU preset),
    whatever model.load_in_4bit says: that flag quantizes the trainer's copy only, and the lab passes
    vLLM no quantization (docs/design.md, "One card holds the plan"). "bitsandbytes" prices vLLM's
    own in-flight 4-bit: QLoRA's layout."""
    if quantization is None:
        return n * (2 if m.dtype in ("bfloat16", "float16") else 4)
    if quantization == "bitsandbytes":
        return _four_bit_bytes(shape, n)
    raise ValueError(f"no weight size known for vLLM quantization {quantization!r}; None or 'bitsandbytes'")


def rollout_weight_bytes(preset: Preset, shape: ModelShape, n: int) -> float:
    """The weights one decode step reads: an in-process engine's own copy (IN_PROCESS_ENGINE), else
    the policy's (the lab's decoder samples the trainer's model)."""
    if preset.gen.backend in IN_PROCESS_ENGINE:
        return engine_weight_bytes(preset.model, shape, n)
    return weight_bytes(preset.model, shape, n)


def trainable_params(m: ModelConfig, shape: ModelShape, n: int) -> int:
    """All n parameters for a full fine-tune (lora_r == 0), else the LoRA adapter's."""
    return n if m.lora_r == 0 else lora_params(shape, m.lora_r, m.target_modules)


def kv_bytes_per_token(shape: ModelShape) -> int:
    """K and V, every layer, every KV head, 2 bytes each (16-bit cache)."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * 2


def params_of(preset: Preset, shape: ModelShape) -> int:
    """The parameter count plan() uses: Qwen2 models carry q/k/v biases."""
    biases = qwen2_biases(shape) if "qwen" in preset.model.name.lower() else 0
    return shape.params(biases)


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
    kv_sequence = kv_bytes_per_token(shape) * (g.max_response_tokens + PROMPT_TOKENS)
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
# error on top; one that fits the GPU but not with the margin is "tight".
MEMORY_MARGIN = 1.3


def rl_on_one_card(memory: MemoryPlan, memory_gib: float) -> dict:
    """An in-process vLLM engine holds its weights and KV cache while the trainer holds the policy,
    its optimizer and activations, on the same card during RL: the two must fit together. The
    engine's share of the card (vLLM's gpu_memory_utilization) is the rollout side's planned need
    with the margin, within [0.1, 0.9]."""
    together = memory.train_total_gib + memory.rollout_total_gib
    share = min(0.9, max(0.1, memory.rollout_total_gib * MEMORY_MARGIN / memory_gib))
    return {"rl_together": fit_verdict(together, memory_gib), "together_gib": round(together, 2),
            "vllm_memory_fraction": round(share, 2)}


def with_engine_share(preset: Preset) -> Preset:
    """The preset with gen.vllm_memory_fraction filled from the plan of it on this card (the
    rollout side's need with the margin, rl_on_one_card), when it is None and a GPU answers; a
    pair of trainer and sampler that does not fit with the margin is warned about. Unchanged
    otherwise, or where the model's shape is unknown (the engine then takes 0.5)."""
    import dataclasses
    import warnings

    if preset.gen.vllm_memory_fraction is not None:
        return preset
    import torch

    try:
        card_gib = torch.cuda.get_device_properties(0).total_memory / GIB
        together = rl_on_one_card(plan(preset, 1, shape_of(preset.model.name)), card_gib)
    except (ValueError, RuntimeError, AssertionError) as exc:
        if torch.cuda.is_available():  # vLLM's CPU build has no share: its cache is VLLM_CPU_KVCACHE_SPACE
            warnings.warn(f"vLLM's share of the GPU: no plan ({exc}); 0.5 (set gen.vllm_memory_fraction)",
                          stacklevel=2)
        return preset
    if together["rl_together"] != "fits":
        verdict = "is tight" if together["rl_together"] == "tight" else "does not fit"
        warnings.warn(f"RL with in-process vLLM {verdict} on this {card_gib:.0f} GiB card "
                      f"({together['together_gib']} GiB planned for trainer and sampler): `coa-lab plan` has the "
                      "breakdown", stacklevel=2)
    gen = dataclasses.replace(preset.gen, vllm_memory_fraction=together["vllm_memory_fraction"])
    return dataclasses.replace(preset, gen=gen)


# vLLM's own default gpu_memory_utilization: an engine alone on the card still leaves a tenth to the
# CUDA contexts (this process's and vLLM's engine process's) and to the sampler's activations
ALONE_SHARE_CAP = 0.9


def _params_named(name: str, shape: ModelShape) -> int:
    """params_of for a model by name (a teacher's, not the preset's): Qwen2 models carry q/k/v biases."""
    return shape.params(qwen2_biases(shape) if "qwen" in name.lower() else 0)


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
    weights = engine_weight_bytes(preset.model, shape, _params_named(name, shape))
    row = kv_bytes_per_token(shape) * (preset.gen.max_response_tokens + PROMPT_TOKENS)
    card = memory_gib * GIB
    want = (weights + preset.gen.batch_size * row) * MEMORY_MARGIN / card
    # rounded up, so the share's rows are never one short of what was asked for
    share = min(ALONE_SHARE_CAP, max(0.1, math.ceil(want * 100) / 100))
    # at least one row: a model whose weights alone overflow the share is reported as such elsewhere
    # (plan_report's teacher line), and its decode is still priced
    rows = max(1, min(preset.gen.batch_size, int((share * card / MEMORY_MARGIN - weights) // row)))
    return {"vllm_memory_fraction": share, "rows": rows, "weights_gib": round(weights / GIB, 3),
            "kv_cache_gib": round(rows * row / GIB, 3)}


def with_engine_alone(preset: Preset, model_name: str | None = None) -> Preset:
    """The preset with gen.vllm_memory_fraction for an engine alone on this card (engine_alone:
    capture and evaluation), when it is None and a GPU answers; unchanged otherwise, or where the
    model's shape is unknown (the engine then takes 0.5). An explicit fraction is the user's choice."""
    import dataclasses
    import warnings

    if preset.gen.vllm_memory_fraction is not None:
        return preset
    import torch

    try:
        card_gib = torch.cuda.get_device_properties(0).total_memory / GIB
        share = engine_alone(preset, card_gib, model_name)["vllm_memory_fraction"]
    except (ValueError, RuntimeError, AssertionError) as exc:
        if torch.cuda.is_available():  # vLLM's CPU build has no share: its cache is VLLM_CPU_KVCACHE_SPACE
            warnings.warn(f"vLLM's share of the GPU alone: no plan ({exc}); 0.5 (set gen.vllm_memory_fraction)",
                          stacklevel=2)
        return preset
    return dataclasses.replace(preset, gen=dataclasses.replace(preset.gen, vllm_memory_fraction=share))


def fit_verdict(total_gib: float, memory_gib: float) -> str:
    if total_gib * MEMORY_MARGIN <= memory_gib:
        return "fits"
    return "tight" if total_gib <= memory_gib else "does not fit"
