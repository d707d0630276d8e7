"""Per-GPU memory and time per step for a preset, from the model's shape: what a course needs
to size hardware (`coa-lab plan --preset P --gpus N`; docs/scaling.md).

Memory. Every term is a formula you can check by hand (tests/test_memory_plan.py does):

    weights      params x bytes per weight (4-bit QLoRA: 0.5 B for the layers' linear weights,
                 the embeddings stay in 16-bit)
    trainable    LoRA: layers x r x (in + out) summed over the target modules; full: all params
    gradients    trainable x bytes of the training dtype
    optimizer    AdamW: 2 fp32 states per trainable parameter, plus an fp32 master copy when the
                 weights train in 16-bit (full fine-tuning)
    activations  per layer, for micro-batch b and length s: 34 s b h bytes in 16-bit (Korthikanti
                 et al. 2022, flash attention: no s^2 term); with gradient checkpointing only each
                 layer's input is kept (2 s b h) plus one layer's full set during its recompute
    logits       b s V x (2 + 4 + 4) bytes in 16-bit (the logits, their fp32 upcast for the loss,
                 and its fp32 gradient), b s V x 8 in fp32: at a 152k vocabulary this is the largest
                 activation of a long sequence
    kv cache     rollouts: 2 (K and V) x layers x kv_heads x head_dim x 2 bytes per token, for
                 gen.batch_size sequences of prompt + max_response_tokens

Sharding over N GPUs: ZeRO-3 / FSDP divides weights, gradients and optimizer states by N; LoRA runs
(ZeRO-2 / DDP) divide the gradients and optimizer states only. Activations, logits and the KV cache
are per GPU. These are estimates: allocator fragmentation, CUDA context (~0.5 GiB) and framework
buffers come on top; against the H100 peaks of docs/gpu-validation.json plan() ran 0-20% low
(`calibration()`), so `fit_verdict` asks for MEMORY_MARGIN on top.

Time (`step_time`). N = the weights a token multiplies through (every layer's linear weights and
the LM head; the input embedding is a lookup), A = LoRA adapter parameters, L layers, d = heads x
head_dim, s the sequence length:

    forward      2 N + 2 A + 2 L s d per token (attention's QK^T and AV: 4 L d FLOPs per key
                 attended, and a causal token attends to s/2 keys on average)
    backward     activation gradients 2 N + 2 x attention (always, frozen weights or not), weight
                 gradients 2 N for a full fine-tune, 4 A for LoRA (the adapter's both gradients)
    recompute    gradient checkpointing runs the forward once more: + forward
    SFT step     tokens = sft.batch_size x grad_accum x max_length x gpus, at those FLOPs per token,
                 over gpus x peak x mfu
    rollouts     prompts_per_step x group_size sequences, each PROMPT_TOKENS + response_fraction x
                 gen.max_response_tokens long, decoded gen.batch_size at a time. Decoding reads the
                 weights (+ the adapter) once per step and the live rows' KV cache at their mean
                 context (prompt + response / 2): per step max(bytes / (hbm x bandwidth_efficiency),
                 FLOPs / (peak x mfu)); the gpus share the bytes (tensor parallel) or the batches
                 (data parallel), the same total either way
    RL update    the rollout tokens through the training FLOPs above, plus the no-grad old-log-prob
                 forward over all but the first mini-batch (coa_lab.rl.trainer.policy_update), at
                 update_mfu

mfu and update_mfu are fitted to the only GPU measurements (docs/gpu-validation.json, an H100 at
batch 1: real utilisation is low, 11-23% for SFT, 6-8% for the DAPO update);
bandwidth_efficiency is assumed, never measured (no vLLM run exists). `calibration()` prints
predicted against measured for every recorded run.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from coa_lab.config import EMBEDDED_MODEL, ModelConfig, Preset, get_preset
from coa_lab.paths import PROJECT_ROOT

GIB = 1024**3
PROMPT_TOKENS = 512  # a typical prompt: the rollouts' KV cache and length assume it

# Shapes of the presets' models (their config.json), so a plan needs no download and no transformers.
KNOWN_SHAPES = {
    EMBEDDED_MODEL: dict(hidden=576, layers=30, heads=9, kv_heads=3, head_dim=64,  # SmolLM2-135M-Instruct
                         intermediate=1536, vocab=49152, tied=True),
    "Qwen/Qwen2.5-3B-Instruct": dict(hidden=2048, layers=36, heads=16, kv_heads=2, head_dim=128,
                                     intermediate=11008, vocab=151936, tied=True),
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
    from coa_lab.models import resolve_model

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


def weight_bytes(m: ModelConfig, shape: ModelShape, n: int) -> float:
    """Bytes of the whole model's weights (unsharded) in the preset's dtype / quantization."""
    if m.load_in_4bit:  # linear weights in 4 bits, the rest (embeddings, norms) in 16-bit
        linear = shape.layers * shape.layer_linear_params()
        return linear * 0.5 + (n - linear) * 2
    return n * (2 if m.dtype in ("bfloat16", "float16") else 4)


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
    kv_cache_gib: float  # gen.batch_size of them at once: the worst case (vLLM pages and queues the rest)
    train_total_gib: float  # weights + gradients + optimizer + activations + logits
    rollout_total_gib: float  # weights + KV cache (a separate vLLM engine holds its own copy)

    def to_dict(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def plan(preset: Preset, gpus: int = 1, shape: ModelShape | None = None) -> MemoryPlan:
    """Per-GPU memory of the preset's SFT/RL training step and of its rollouts, on `gpus` GPUs."""
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
    act_ckpt = shape.layers * 2 * s * b * h + 34 * s * b * h
    activations = act_ckpt if m.gradient_checkpointing else act_full
    logits = b * s * shape.vocab * (2 + 4 + 4 if half else 4 + 4)
    g = preset.gen
    kv_sequence = kv_bytes_per_token(shape) * (g.max_response_tokens + PROMPT_TOKENS)
    kv = kv_sequence * g.batch_size
    train = weights + grads + optimizer + activations + logits
    return MemoryPlan(
        params=n, trainable=trainable, weights_gib=weights / GIB, gradients_gib=grads / GIB,
        optimizer_gib=optimizer / GIB, activations_gib=activations / GIB, activations_no_ckpt_gib=act_full / GIB,
        activations_ckpt_gib=act_ckpt / GIB, logits_gib=logits / GIB, kv_per_sequence_mib=kv_sequence / 1024**2, kv_cache_gib=kv / GIB,
        train_total_gib=train / GIB, rollout_total_gib=(weights + kv) / GIB,
    )


# --- hardware --------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPUSpec:
    name: str
    bf16_tflops: float  # dense tensor-core peak, TFLOP/s
    hbm_gbps: float  # memory bandwidth, GB/s (1e9 bytes)
    memory_gib: float


# Vendor datasheets (NVIDIA H100 SXM, H200 SXM, A100 80GB SXM, L4): dense bf16, no 2:4
# sparsity (the datasheets' headline figures are twice these, with sparsity). Memory as the
# datasheets give it; the measured H100 80GB HBM3 reports 81,559 MiB (79.6 GiB) in total.
GPUS = {
    "H100": GPUSpec("NVIDIA H100 SXM 80GB", bf16_tflops=989.0, hbm_gbps=3350.0, memory_gib=80.0),
    "H200": GPUSpec("NVIDIA H200 SXM 141GB", bf16_tflops=989.0, hbm_gbps=4800.0, memory_gib=141.0),
    "A100": GPUSpec("NVIDIA A100 80GB SXM", bf16_tflops=312.0, hbm_gbps=2039.0, memory_gib=80.0),
    "L4": GPUSpec("NVIDIA L4 24GB", bf16_tflops=121.0, hbm_gbps=300.0, memory_gib=24.0),
}


def gpu_spec(gpu: GPUSpec | str) -> GPUSpec:
    """A GPUSpec as given, or one of GPUS by name (any case)."""
    if isinstance(gpu, GPUSpec):
        return gpu
    by_lower = {k.lower(): v for k, v in GPUS.items()}
    if gpu.lower() not in by_lower:
        raise ValueError(f"unknown GPU {gpu!r}; choose one of {sorted(GPUS)} "
                         f"(or pass memory_plan.GPUSpec(...) from its datasheet)")
    return by_lower[gpu.lower()]


# --- FLOPs per token -----------------------------------------------------------------------


def matmul_params(shape: ModelShape) -> int:
    """Weights a token multiplies through: every layer's linear weights and the LM head (a tied
    head still multiplies; the input embedding is a lookup, no FLOPs)."""
    return shape.layers * shape.layer_linear_params() + shape.vocab * shape.hidden


def attention_flops(shape: ModelShape, s: float) -> float:
    """Forward FLOPs per token of QK^T and AV in a causal sequence of length s.

    Per key attended: 2 x d for the score, 2 x d for the weighted value (d = heads x head_dim),
    every layer; a causal token attends to s/2 keys on average, and flash attention skips the
    masked blocks: 2 L d s. (PaLM's MFU counts 4 L d s, as if every token saw all s keys.)"""
    return 2 * shape.layers * shape.heads * shape.head_dim * s


def forward_flops(shape: ModelShape, s: float, adapter: int = 0) -> float:
    """Forward FLOPs per token: 2 per multiplied weight (base and LoRA adapter) + attention."""
    return 2 * (matmul_params(shape) + adapter) + attention_flops(shape, s)


def train_flops(shape: ModelShape, s: float, adapter: int, full: bool, checkpointing: bool) -> float:
    """Forward + backward (+ recompute) FLOPs per trained token.

    The backward always computes activation gradients through every layer (2 N, and twice the
    attention forward: attention has no weights, only inputs); weight gradients cost 2 N more for
    a full fine-tune, and only the adapter's 4 A (both of its gradients) for LoRA: frozen
    weights get none. Checkpointing recomputes each layer's forward during the backward."""
    n = matmul_params(shape)
    forward = forward_flops(shape, s, adapter)
    backward = 2 * n + 2 * attention_flops(shape, s) + (2 * n if full else 4 * adapter)
    return forward + backward + (forward if checkpointing else 0.0)


# --- time per step ---------------------------------------------------------------------------

# Defaults, each fitted or assumed as calibration() shows (docs/scaling.md):
# fitted: the four H100 SFT runs imply 0.11-0.23 (batch 1, LoRA, 3 steps). Their tokens/s rose
# from 4k to 8k context where this model predicts a small fall (attention): a fixed ~0.5 s per
# step dominates such short runs, and without it the marginal utilisation is 0.37-0.56, so for
# large steps (the presets') these estimates may be 2-3x pessimistic (docs/scaling.md)
SFT_MFU = 0.15
UPDATE_MFU = 0.07  # fitted: the two H100 DAPO updates imply 0.062 and 0.083
BANDWIDTH_EFFICIENCY = 0.6  # assumed: no vLLM decode has been measured (docs/gpu-validation.md)
RESPONSE_FRACTION = 0.5  # assumed: the average rollout uses half of gen.max_response_tokens


def adapter_params(preset: Preset, shape: ModelShape) -> int:
    """LoRA parameters, whose matmuls add FLOPs beside the base's; 0 for a full fine-tune."""
    m = preset.model
    return 0 if m.lora_r == 0 else lora_params(shape, m.lora_r, m.target_modules)


def sft_step_seconds(preset: Preset, gpus: int, gpu: GPUSpec, shape: ModelShape,
                     mfu: float = SFT_MFU) -> tuple[int, float, float]:
    """(tokens per optimizer step over all GPUs, FLOPs per token, seconds per step).

    Data parallel: each GPU trains batch_size x grad_accum sequences of max_length (every sequence
    taken at full length: packing or long data), so the step's time does not depend on gpus."""
    m, sft = preset.model, preset.sft
    adapter = adapter_params(preset, shape)
    per_token = train_flops(shape, sft.max_length, adapter, m.lora_r == 0, m.gradient_checkpointing)
    tokens_per_gpu = sft.batch_size * sft.grad_accum * sft.max_length
    seconds = tokens_per_gpu * per_token / (gpu.bf16_tflops * 1e12 * mfu)
    return tokens_per_gpu * gpus, per_token, seconds


def decode_seconds(preset: Preset, shape: ModelShape, rollouts: int, prompt: float, response: float,
                   gpus: int, gpu: GPUSpec, bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY,
                   mfu: float = SFT_MFU) -> tuple[float, str]:
    """(seconds to decode `rollouts` sequences of `response` new tokens, the bound: memory or compute).

    Batches of gen.batch_size; a batch takes `response` decode steps (with continuous batching a
    finished row's slot is refilled, so the average length is what a slot costs). One step reads
    the weights and the adapter once, plus each live row's KV cache at its mean context
    (prompt + response / 2), and does 2 FLOPs per weight per row plus attention over that context."""
    m = preset.model
    n = params_of(preset, shape)
    adapter = adapter_params(preset, shape)
    rows = min(preset.gen.batch_size, rollouts)
    batches = math.ceil(rollouts / preset.gen.batch_size)
    context = prompt + response / 2
    step_bytes = weight_bytes(m, shape, n) + 2 * adapter + rows * kv_bytes_per_token(shape) * context
    # a decode token attends to its whole context: twice the causal average of attention_flops
    step_flops = rows * (2 * (matmul_params(shape) + adapter) + 2 * attention_flops(shape, context))
    memory_s = step_bytes / (gpus * gpu.hbm_gbps * 1e9 * bandwidth_efficiency)
    compute_s = step_flops / (gpus * gpu.bf16_tflops * 1e12 * mfu)
    return batches * response * max(memory_s, compute_s), ("memory" if memory_s >= compute_s else "compute")


def update_seconds(preset: Preset, shape: ModelShape, rollouts: int, length: float, old_logprob_fraction: float,
                   gpus: int, gpu: GPUSpec, mfu: float = UPDATE_MFU) -> tuple[float, float]:
    """(tokens, seconds) of one policy update: every rollout token through the training FLOPs,
    plus a no-grad forward over `old_logprob_fraction` of them for the old log-probs."""
    m = preset.model
    adapter = adapter_params(preset, shape)
    per_token = (train_flops(shape, length, adapter, m.lora_r == 0, m.gradient_checkpointing)
                 + old_logprob_fraction * forward_flops(shape, length, adapter))
    tokens = rollouts * length
    return tokens, tokens * per_token / (gpus * gpu.bf16_tflops * 1e12 * mfu)


def old_logprob_fraction(preset: Preset) -> float:
    """Share of the rollouts needing a separate old-log-prob forward in policy_update: all but the
    first mini-batch (whose own forward is the sampling policy's); mini-batches are whole groups."""
    mini_batches = max(1, min(preset.rl.mini_batches, preset.rl.prompts_per_step))
    return 1 - 1 / mini_batches


@dataclass
class StepTime:
    gpu: str
    gpus: int
    sft_tokens_per_step: int  # over all GPUs
    sft_flops_per_token: float
    sft_seconds: float  # one optimizer step
    sft_tokens_per_s: float  # over all GPUs
    rl_rollouts: int  # prompts_per_step x group_size (one sampling round, no anchors)
    rl_response_tokens: float  # assumed average per rollout
    rl_rollout_seconds: float
    rl_rollout_bound: str  # "memory" (bandwidth) or "compute"
    rl_update_tokens: float
    rl_update_seconds: float
    rl_step_seconds: float  # rollouts + update
    rl_steps: int
    rl_run_hours: float  # rl.steps of them
    assumptions: dict

    def to_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def step_time(preset: Preset, gpus: int = 1, gpu: GPUSpec | str = "H100", shape: ModelShape | None = None,
              mfu: float = SFT_MFU, update_mfu: float = UPDATE_MFU,
              bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY, response_fraction: float = RESPONSE_FRACTION,
              prompt_tokens: int = PROMPT_TOKENS) -> StepTime:
    """Seconds per SFT optimizer step and per RL step (rollouts, update) on `gpus` x `gpu`.

    Assumptions, each a parameter (the module docstring has the formulas):
      mfu=0.15                  achieved / peak FLOPs in SFT (recompute counted as work done), fitted
                                to the H100 runs of docs/gpu-validation.json: their tokens/s within 40%
      update_mfu=0.07           the same for the RL update, fitted to the two DAPO runs: within 20%
      bandwidth_efficiency=0.6  achieved / peak HBM bandwidth while decoding; assumed, not measured
      response_fraction=0.5     average rollout length / gen.max_response_tokens; assumed
      prompt_tokens=512         prompt length of every rollout; assumed
    The RL step is one sampling round of prompts_per_step x group_size rollouts: anchors and extra
    dynamic-sampling rounds add more. Rollouts are assumed to decode gen.batch_size at a time; when
    their KV cache does not fit (plan().rollout_total_gib), vLLM decodes fewer at once and takes longer."""
    if gpus < 1:
        raise ValueError("gpus must be >= 1")
    for name, value in (("mfu", mfu), ("update_mfu", update_mfu), ("bandwidth_efficiency", bandwidth_efficiency),
                        ("response_fraction", response_fraction)):
        if not 0 < value <= 1:
            raise ValueError(f"{name} must be in (0, 1], got {value}")
    spec = gpu_spec(gpu)
    shape = shape or shape_of(preset.model.name)
    sft_tokens, sft_per_token, sft_s = sft_step_seconds(preset, gpus, spec, shape, mfu)
    rl = preset.rl
    rollouts = rl.prompts_per_step * rl.group_size
    response = response_fraction * preset.gen.max_response_tokens
    rollout_s, bound = decode_seconds(preset, shape, rollouts, prompt_tokens, response, gpus, spec,
                                      bandwidth_efficiency, mfu)
    update_tokens, update_s = update_seconds(preset, shape, rollouts, prompt_tokens + response,
                                             old_logprob_fraction(preset), gpus, spec, update_mfu)
    return StepTime(
        gpu=spec.name, gpus=gpus, sft_tokens_per_step=sft_tokens, sft_flops_per_token=sft_per_token,
        sft_seconds=sft_s, sft_tokens_per_s=sft_tokens / sft_s, rl_rollouts=rollouts, rl_response_tokens=response,
        rl_rollout_seconds=rollout_s, rl_rollout_bound=bound, rl_update_tokens=update_tokens,
        rl_update_seconds=update_s, rl_step_seconds=rollout_s + update_s, rl_steps=rl.steps,
        rl_run_hours=rl.steps * (rollout_s + update_s) / 3600,
        assumptions=dict(mfu=mfu, update_mfu=update_mfu, bandwidth_efficiency=bandwidth_efficiency,
                         response_fraction=response_fraction, prompt_tokens=prompt_tokens,
                         old_logprob_fraction=old_logprob_fraction(preset)),
    )


# --- does it fit -----------------------------------------------------------------------------

# plan() ran up to 20% under the measured H100 peaks (calibration(): ratios 0.80-1.00; the worst
# peak was 1.25x its plan), so a plan "fits" only with that error, and a little, on top; one
# that fits the GPU but not with the margin is "tight".
MEMORY_MARGIN = 1.3


def fit_verdict(total_gib: float, memory_gib: float) -> str:
    if total_gib * MEMORY_MARGIN <= memory_gib:
        return "fits"
    return "tight" if total_gib <= memory_gib else "does not fit"


# --- calibration against the real GPU runs ---------------------------------------------------

VALIDATION_JSON = PROJECT_ROOT / "docs" / "gpu-validation.json"
# The errors stated for the defaults (tests/test_memory_plan.py holds calibration() to them):
SFT_TOKENS_PER_S_ERROR = 0.40  # |predicted / measured - 1| of SFT tokens/s
UPDATE_SECONDS_ERROR = 0.20  # the same for the DAPO update's seconds
MEMORY_RATIO_RANGE = (0.75, 1.05)  # predicted / measured peak memory


@dataclass
class CalibrationRow:
    run: str
    quantity: str  # "sft_tokens_per_s", "update_seconds", "decode_tokens_per_s", "peak_gib"
    predicted: float
    measured: float

    @property
    def ratio(self) -> float:
        return self.predicted / self.measured


def calibration(path: Path = VALIDATION_JSON, gpu: GPUSpec | str = "H100", mfu: float = SFT_MFU,
                update_mfu: float = UPDATE_MFU,
                bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY) -> list[CalibrationRow]:
    """Predicted against measured for every run in docs/gpu-validation.json (benchmarks/gpu_validate.py).

    Those runs: the Qwen2.5-3B shape, LoRA r=64 on all linear layers, checkpointing, on one H100.
    SFT at batch 1 and the given context. The DAPO update ran at commit 19694f8, whose
    policy_update computed old log-probs for all 8 rollouts (micro-batches of 4, no grad), then
    trained 4 mini-batches of 2: its peak memory is set by the larger logits of the no-grad pass
    (2 + 4 + 4 bytes per position, plan()'s logits term), so it is compared with plan() at a
    micro-batch of 4 x (prompt + response). Rollouts came from HF generate (batch 8, PEFT-wrapped,
    short chat prompts taken as 64 tokens): launch-bound, far from the bandwidth bound modelled here."""
    spec = gpu_spec(gpu)
    data = json.loads(Path(path).read_text())
    shape = shape_of("Qwen/Qwen2.5-3B-Instruct")
    rows = []

    def preset_for(four_bit: bool, batch: int, length: int) -> Preset:
        base = get_preset("gpu-3b-qlora")
        return replace(base, model=replace(base.model, load_in_4bit=four_bit, use_unsloth=False),
                       sft=replace(base.sft, batch_size=batch, grad_accum=1, max_length=length))

    for r in data["sft"]:
        label = f"SFT {r['context']:,} tok, {'4-bit' if r['four_bit'] else 'bf16'}"
        p = preset_for(r["four_bit"], 1, r["context"])
        rows.append(CalibrationRow(label, "sft_tokens_per_s",
                                   step_time(p, 1, spec, shape, mfu=mfu).sft_tokens_per_s, r["tokens_per_s"]))
        rows.append(CalibrationRow(label, "peak_gib", plan(p, 1, shape).train_total_gib, r["peak_mem_gib"]))
    for r in data["rl"]:
        d, g = r["dapo"], r["generation"]
        weights = "4-bit" if d["four_bit"] else "bf16"
        label = f"DAPO {d['group_size']} x ({d['prompt_len']} + {d['response_len']}), {weights}"
        length = d["prompt_len"] + d["response_len"]
        p = preset_for(d["four_bit"], 4, length)
        _, seconds = update_seconds(p, shape, d["group_size"], length, 1.0, 1, spec, update_mfu)
        rows.append(CalibrationRow(label, "update_seconds", seconds, d["seconds"]))
        rows.append(CalibrationRow(label, "peak_gib", plan(p, 1, shape).train_total_gib, d["peak_mem_gib"]))
        per_row = g["new_tokens"] / g["batch"]
        p = replace(p, gen=replace(p.gen, batch_size=g["batch"]))
        seconds, _ = decode_seconds(p, shape, g["batch"], 64, per_row, 1, spec, bandwidth_efficiency, mfu)
        rows.append(CalibrationRow(f"HF generate, batch {g['batch']}, {weights}",
                                   "decode_tokens_per_s", g["new_tokens"] / seconds, g["tokens_per_s"]))
    return rows


def format_calibration(rows: list[CalibrationRow]) -> str:
    """The table docs/scaling.md shows: planner against measured, their ratio and the error."""
    units = {"sft_tokens_per_s": "tokens/s", "update_seconds": "s", "decode_tokens_per_s": "tokens/s",
             "peak_gib": "GiB peak"}
    lines = [f"{'run':<34} {'quantity':<9} {'planner':>9} {'measured':>9} {'ratio':>6} {'error':>7}"]
    for r in rows:
        lines.append(f"{r.run:<34} {units[r.quantity]:<9} {r.predicted:>9.4g} {r.measured:>9.4g} "
                     f"{r.ratio:>6.2f} {r.ratio - 1:>+7.0%}")
    return "\n".join(lines)


# --- the whole plan, as `coa-lab plan` prints it ---------------------------------------------


def planner_report(preset: Preset, gpus: int = 1, gpu: GPUSpec | str = "H100", shape: ModelShape | None = None,
                   **assumptions) -> dict:
    """Memory (plan), whether it fits (fit_verdict) and time (step_time) as one JSON-ready dict;
    `assumptions` go to step_time (mfu, update_mfu, bandwidth_efficiency, response_fraction, prompt_tokens)."""
    spec = gpu_spec(gpu)
    shape = shape or shape_of(preset.model.name)
    memory = plan(preset, gpus, shape)
    times = step_time(preset, gpus, spec, shape, **assumptions)
    m = preset.model
    return {
        "preset": preset.name, "gpus": gpus, "gpu": asdict(spec),
        "model": {"name": m.name, "params": memory.params, "trainable": memory.trainable,
                  "lora_r": m.lora_r, "load_in_4bit": m.load_in_4bit, "dtype": m.dtype,
                  "gradient_checkpointing": m.gradient_checkpointing},
        "memory_gib": memory.to_dict(),
        "fits": {"train": fit_verdict(memory.train_total_gib, spec.memory_gib),
                 "rollout": fit_verdict(memory.rollout_total_gib, spec.memory_gib),
                 "margin": MEMORY_MARGIN},
        "time": times.to_dict(),
    }


def _seconds(s: float) -> str:
    """Seconds as a person reads them: 0.42 s, 37 s, 12.5 min, 3.1 h."""
    if s < 10:
        return f"{s:.2f} s"
    if s < 600:
        return f"{s:.0f} s"
    return f"{s / 60:.1f} min" if s < 36000 else f"{s / 3600:.1f} h"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def format_report(r: dict) -> str:
    """planner_report as the readable table `coa-lab plan` prints."""
    g, m, mem, t, a = r["gpu"], r["model"], r["memory_gib"], r["time"], r["time"]["assumptions"]
    kind = "full fine-tune" if m["lora_r"] == 0 else f"LoRA r={m['lora_r']}"
    weights = "4-bit" if m["load_in_4bit"] else m["dtype"]
    ckpt = "on" if m["gradient_checkpointing"] else "off"
    memory = g["memory_gib"]
    lines = [
        f"{r['preset']} on {r['gpus']} x {g['name']} ({g['bf16_tflops']:g} TFLOP/s bf16 dense, "
        f"{g['hbm_gbps']:g} GB/s, {memory:g} GiB)",
        f"model {m['name']}: {m['params'] / 1e9:.2f}B params, {kind} ({_count(m['trainable'])} trainable), "
        f"{weights} weights, gradient checkpointing {ckpt}",
        "",
        "memory per GPU (GiB)",
    ]
    rows = [("weights", mem["weights_gib"]), ("gradients", mem["gradients_gib"]),
            ("optimizer (AdamW)", mem["optimizer_gib"]),
            (f"activations (checkpointing {ckpt})", mem["activations_gib"]),
            ("  without checkpointing", mem["activations_no_ckpt_gib"]),
            ("  with checkpointing", mem["activations_ckpt_gib"]),
            ("logits", mem["logits_gib"])]
    lines += [f"  {name:<36} {v:>9.2f}" for name, v in rows]
    lines.append(f"  {'train total':<36} {mem['train_total_gib']:>9.2f}   {r['fits']['train']}")
    lines.append(f"  {'KV cache of the rollout batch':<36} {mem['kv_cache_gib']:>9.2f}   "
                 f"({mem['kv_per_sequence_mib']:.0f} MiB per full-length rollout)")
    lines.append(f"  {'rollout total':<36} {mem['rollout_total_gib']:>9.2f}   {r['fits']['rollout']}")
    lines += [f"  fits: estimate x {r['fits']['margin']} <= {memory:g} GiB (plan() ran up to 20% under the H100's",
              "  measured peaks); tight: only the estimate itself fits", "", "time per step (estimates)"]
    tokens_per_gpu = t["sft_tokens_per_step"] // r["gpus"]
    lines += [
        f"  {'SFT optimizer step':<36} {_seconds(t['sft_seconds']):>9}   {tokens_per_gpu:,} tokens per GPU, "
        f"{t['sft_tokens_per_s']:,.0f} tokens/s over all GPUs",
        f"  {'RL rollouts':<36} {_seconds(t['rl_rollout_seconds']):>9}   {t['rl_rollouts']} rollouts of "
        f"~{a['prompt_tokens']} + {t['rl_response_tokens']:.0f} tokens, {t['rl_rollout_bound']}-bound",
        f"  {'RL update':<36} {_seconds(t['rl_update_seconds']):>9}   {t['rl_update_tokens']:,.0f} tokens",
        f"  {'RL step':<36} {_seconds(t['rl_step_seconds']):>9}   {_seconds(t['rl_run_hours'] * 3600)} for the "
        f"preset's {t['rl_steps']} RL steps",
        *(["  (RL refuses full-parameter training with vLLM sampling today, docs/scaling.md: the RL rows only price it)"]
          if m["lora_r"] == 0 else []),
        "",
        f"assumptions: mfu={a['mfu']} (SFT; fitted to the H100 runs, tokens/s within "
        f"{SFT_TOKENS_PER_S_ERROR:.0%}), update_mfu={a['update_mfu']} (fitted to 2 DAPO updates, within "
        f"{UPDATE_SECONDS_ERROR:.0%}),",
        f"  bandwidth_efficiency={a['bandwidth_efficiency']} (assumed: no vLLM decode measured), "
        f"response_fraction={a['response_fraction']} of gen.max_response_tokens, prompt_tokens={a['prompt_tokens']},",
        f"  old-log-prob forward over {a['old_logprob_fraction']:.2f} of the rollouts; one sampling round, "
        "no anchors; see docs/scaling.md",
    ]
    return "\n".join(lines)
