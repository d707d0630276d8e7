"""Time per SFT / RL step for a preset on a given GPU, from the model's shape (`coa-lab plan`;
docs/scaling.md). Memory is coa_lab/planning/memory_plan.py.

N = the weights a token multiplies through (every layer's linear weights and
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
                 gen.max_response_tokens long, decoded gen.batch_size at a time (or as many as
                 gen.kv_budget_gib holds at full length; capture and evaluation with an in-process
                 engine: the rows it holds alone on the card, engine_share.engine_alone). Decoding
                 reads the sampler's weights (an in-process vLLM engine's 16-bit copy,
                 memory_plan.rollout_weight_bytes; + the adapter) once per step and the live rows'
                 KV cache at their mean context (prompt + response / 2): per step max(bytes / (hbm x bandwidth_efficiency),
                 FLOPs / (peak x mfu)); the gpus share the bytes (tensor parallel) or the batches
                 (data parallel), the same total either way
    RL update    the rollout tokens through the training FLOPs above, plus the no-grad old-log-prob
                 forward over all but the first mini-batch (coa_lab.rl.update.policy_update), at
                 update_mfu

mfu and update_mfu are fitted to the only GPU measurements (docs/gpu-validation.json, an H100 at
batch 1: real utilisation is low, 11-23% for SFT, 6-8% for the DAPO update);
bandwidth_efficiency is assumed, never measured (no vLLM run exists). `calibration()` prints
predicted against measured for every recorded run (coa_lab/planning/plan_report.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from coa_lab.config import Preset
from coa_lab.generation.backends import PROMPT_TOKENS, rows_for_budget
from coa_lab.generation.engine_share import IN_PROCESS_ENGINE, engine_alone, kv_bytes_per_token
from coa_lab.generation.model_shape import ModelShape, qwen2_biases, shape_of
from coa_lab.planning.memory_plan import lora_params, params_of, rollout_weight_bytes


# --- hardware --------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPUSpec:
    name: str
    bf16_tflops: float  # dense tensor-core peak, TFLOP/s
    hbm_gbps: float  # memory bandwidth, GB/s (1e9 bytes)
    memory_gib: float


# Vendor datasheets (NVIDIA H100 SXM, H200 SXM, A100 80GB SXM, L4, A10, T4): dense bf16, no 2:4
# sparsity (the datasheets' headline figures are twice these, with sparsity). Memory as the
# datasheets give it; the measured H100 80GB HBM3 reports 81,559 MiB (79.6 GiB) in total. The T4
# has no bf16: its row is fp16 tensor-core throughput (65 TFLOP/s), what a 16-bit run gets there.
GPUS = {
    "H100": GPUSpec("NVIDIA H100 SXM 80GB", bf16_tflops=989.0, hbm_gbps=3350.0, memory_gib=80.0),
    "H200": GPUSpec("NVIDIA H200 SXM 141GB", bf16_tflops=989.0, hbm_gbps=4800.0, memory_gib=141.0),
    "A100": GPUSpec("NVIDIA A100 80GB SXM", bf16_tflops=312.0, hbm_gbps=2039.0, memory_gib=80.0),
    "L4": GPUSpec("NVIDIA L4 24GB", bf16_tflops=121.0, hbm_gbps=300.0, memory_gib=24.0),
    "A10": GPUSpec("NVIDIA A10 24GB", bf16_tflops=125.0, hbm_gbps=600.0, memory_gib=24.0),
    "T4": GPUSpec("NVIDIA T4 16GB", bf16_tflops=65.0, hbm_gbps=320.0, memory_gib=16.0),
}


def gpu_spec(gpu: GPUSpec | str) -> GPUSpec:
    """A GPUSpec as given, or one of GPUS by name (any case)."""
    if isinstance(gpu, GPUSpec):
        return gpu
    by_lower = {k.lower(): v for k, v in GPUS.items()}
    if gpu.lower() not in by_lower:
        raise ValueError(f"unknown GPU {gpu!r}; choose one of {sorted(GPUS)} "
                         f"(or pass step_time.GPUSpec(...) from its datasheet)")
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
# The lab's own decoder (gen.backend "hf") on a GPU: a decode step never takes less than this,
# whatever the FLOPs and bytes say. Fitted to the embedded 135M model's pool screening on an H100
# (docs/results/gpu_smoke_h100.json: 1,912 rollouts in 8 batches of <= 256 in 279 s, ~160 steps
# a batch at the planner's response length): Python per token, tool calls between turns and each
# batch's slowest rows set a small model's pace, not the GPU. vLLM's engine is not held to it.
DECODER_STEP_FLOOR_S = 0.2


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
                   mfu: float = SFT_MFU, weights: float | None = None, rows: int | None = None) -> tuple[float, str]:
    """(seconds to decode `rollouts` sequences of `response` new tokens, the bound: memory or compute).

    Batches of gen.batch_size; a batch takes `response` decode steps (with continuous batching a
    finished row's slot is refilled, so the average length is what a slot costs). One step reads
    the weights and the adapter once, plus each live row's KV cache at its mean context
    (prompt + response / 2), and does 2 FLOPs per weight per row plus attention over that context.
    weights: the bytes a step reads; None: the sampler's (memory_plan.rollout_weight_bytes: an
    in-process vLLM engine's 16-bit copy, or the policy's own for the lab's decoder).
    rows: rows decoded at once; None: gen.batch_size, or what gen.kv_budget_gib holds (alone_rows)."""
    n = params_of(preset, shape)
    adapter = adapter_params(preset, shape)
    # as many rows at once as the decoder takes: gen.batch_size, or what gen.kv_budget_gib holds
    # at full length (generation/backends.rows_for_budget; memory_plan sizes the cache the same way),
    # unless the caller knows better (`rows`: capture and evaluation's engine alone on the card)
    full_row = kv_bytes_per_token(shape) * (PROMPT_TOKENS + preset.gen.max_response_tokens)
    budget_rows = rows or rows_for_budget(preset.gen, full_row)
    rows = min(budget_rows, rollouts)
    batches = math.ceil(rollouts / budget_rows)
    context = prompt + response / 2
    weights = rollout_weight_bytes(preset, shape, n) if weights is None else weights
    step_bytes = weights + 2 * adapter + rows * kv_bytes_per_token(shape) * context
    # a decode token attends to its whole context: twice the causal average of attention_flops
    step_flops = rows * (2 * (matmul_params(shape) + adapter) + 2 * attention_flops(shape, context))
    memory_s = step_bytes / (gpus * gpu.hbm_gbps * 1e9 * bandwidth_efficiency)
    compute_s = step_flops / (gpus * gpu.bf16_tflops * 1e12 * mfu)
    floor_s = DECODER_STEP_FLOOR_S if preset.gen.backend == "hf" else 0.0
    bound = "memory" if memory_s >= compute_s else "compute"
    if floor_s > max(memory_s, compute_s):
        bound = "decoder-overhead"
    return batches * response * max(memory_s, compute_s, floor_s), bound


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


def sft_examples(preset: Preset) -> int:
    """The SFT set's size if every captured task were kept (an upper bound: distillation drops
    the teacher's failures; the multi-hop share included), plus distill.imported_per_suite for
    each suite captured."""
    suites = {key.split("/")[0] for key in preset.capture.tasks}
    captured = sum(preset.capture.tasks.values()) + sum(preset.capture.multi_hop_tasks.values())
    return captured + preset.distill.imported_per_suite * len(suites)


def agent_calls(hops: int) -> int:
    """Teacher agent activations per capture run of `hops` tool hops: planner, thinker and answer
    writer, and per hop a tool agent, a reflector and a verifier (the embedded teacher's capture
    on an H100 logged 6 a run at one hop and 9 at two: docs/results/gpu_smoke_h100.json's run)."""
    return 3 + 3 * hops


def alone_rows(preset: Preset, shape: ModelShape, gpu: GPUSpec, model_name: str | None = None) -> int | None:
    """Rows capture and evaluation decode at once: an in-process engine (gen.backend "vllm"/"auto")
    has the card to itself there, no trainer beside it (engine_share.engine_alone); None for the lab's
    decoder, which honours gen.kv_budget_gib in every stage, and a vLLM server (its own node)."""
    if preset.gen.backend not in IN_PROCESS_ENGINE:
        return None
    return engine_alone(preset, gpu.memory_gib, model_name, shape)["rows"]


def capture_seconds(preset: Preset, shape: ModelShape, gpus: int, gpu: GPUSpec,
                    bandwidth_efficiency: float, mfu: float, prompt_tokens: int) -> float | None:
    """The local teacher's capture: every capture task's agent calls of capture.teacher_max_new_tokens
    (the multi-hop share at its hops), decoded like rollouts. None for a remote teacher
    (capture.teacher_url): its time is the endpoint's, not this GPU's."""
    cap = preset.capture
    if cap.teacher_url:
        return None
    calls = (sum(cap.tasks.values()) * agent_calls(cap.max_hops)
             + sum(cap.multi_hop_tasks.values()) * agent_calls(cap.multi_hop_hops))
    teacher = teacher_shape(preset, shape)
    return decode_seconds(preset, teacher, calls, prompt_tokens, cap.teacher_max_new_tokens, gpus, gpu,
                          bandwidth_efficiency, mfu, rows=alone_rows(preset, teacher, gpu, _teacher_name(preset)))[0]


def _teacher_name(preset: Preset) -> str:
    return preset.capture.teacher_model or preset.model.name


def _alone_fields(preset: Preset, shape: ModelShape, gpu: GPUSpec) -> dict:
    """StepTime's eval_rows, capture_rows and engine_alone_share: the rows capture and evaluation
    decode at once (alone_rows, else the decoder's gen.kv_budget_gib rows, as in RL)."""
    def rows(s: ModelShape, name: str | None = None) -> int:
        kv_rows = rows_for_budget(preset.gen, kv_bytes_per_token(s) * (PROMPT_TOKENS + preset.gen.max_response_tokens))
        return alone_rows(preset, s, gpu, name) or kv_rows

    in_process = preset.gen.backend in IN_PROCESS_ENGINE
    return {"eval_rows": rows(shape),
            "capture_rows": None if preset.capture.teacher_url
            else rows(teacher_shape(preset, shape), _teacher_name(preset)),
            "engine_alone_share": engine_alone(preset, gpu.memory_gib, shape=shape)["vllm_memory_fraction"]
            if in_process else None}


def _teacher_fields(preset: Preset, shape: ModelShape) -> dict:
    t = teacher_shape(preset, shape)
    if t is shape or preset.capture.teacher_url:
        return {}
    return {"teacher": preset.capture.teacher_model, "teacher_weights_gib": 2 * t.params(qwen2_biases(t)) / 1024**3}


def teacher_shape(preset: Preset, shape: ModelShape) -> ModelShape:
    """The local teacher's shape: the student's (`shape`) unless capture.teacher_model names
    another model, whose decode is what the capture then costs (a 7B teacher decodes at about
    a third of a 3B's rate where memory bandwidth bounds it)."""
    name = preset.capture.teacher_model
    return shape if not name or name == preset.model.name else shape_of(name)


def eval_seconds(preset: Preset, shape: ModelShape, gpus: int, gpu: GPUSpec, response: float,
                 bandwidth_efficiency: float, mfu: float, prompt_tokens: int) -> float:
    """Evaluation: base, SFT and RL on the test and validation mixes, eval.samples rollouts a task
    each, and the multi-agent teacher once on the headline tasks (eval.teacher, the cost comparison)."""
    ev, cap = preset.eval, preset.capture
    rollouts = 3 * (sum(ev.tasks.values()) + sum(ev.val_tasks.values())) * max(1, ev.samples)
    seconds = decode_seconds(preset, shape, rollouts, prompt_tokens, response, gpus, gpu, bandwidth_efficiency, mfu,
                             rows=alone_rows(preset, shape, gpu))[0]
    if ev.teacher and not cap.teacher_url:
        headline = sum(n for key, n in ev.tasks.items() if key in ev.headline)
        teacher = teacher_shape(preset, shape)
        seconds += decode_seconds(preset, teacher, headline * agent_calls(cap.max_hops), prompt_tokens,
                                  cap.teacher_max_new_tokens, gpus, gpu, bandwidth_efficiency, mfu,
                                  rows=alone_rows(preset, teacher, gpu, _teacher_name(preset)))[0]
    return seconds


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
    sft_epochs: float
    sft_examples: int  # trajectories SFT trains on (sft_examples(): every capture kept, an upper bound)
    sft_example_tokens: float  # assumed average per trajectory, prompt included
    sft_run_hours: float  # sft.epochs over them
    pool_candidates: int
    pool_samples: int
    pool_screen_hours: float  # rl.pool candidates x rl.pool_samples rollouts, before RL
    total_hours: float  # SFT run + pool screening + RL run (the training; capture and evaluation below)
    capture_hours: float | None  # the local teacher's capture; None for a remote teacher (capture.teacher_url)
    eval_hours: float  # base, SFT and RL on test + validation, and the teacher on the headline tasks
    afternoon_hours: float  # everything: capture + SFT + screening + RL + evaluation
    # rows evaluation decodes at once (the student's): an in-process engine's alone on the card
    # (engine_share.engine_alone), else what the decoder's gen.kv_budget_gib holds, as in RL
    eval_rows: int
    capture_rows: int | None  # the local teacher's, the same way; None for a remote teacher
    engine_alone_share: float | None  # the in-process engine's share of the card there; None without one
    assumptions: dict
    # a local teacher other than the student (capture.teacher_model): its name and bf16 weights,
    # which the capture holds on the card before training starts; None where the student teaches
    teacher: str | None = None
    teacher_weights_gib: float | None = None

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
    The SFT run: sft.epochs over sft_examples(preset) trajectories of prompt_tokens +
    response_fraction x distill.max_trajectory_tokens each, at the SFT step's tokens/s.
    The RL step is one sampling round of prompts_per_step x group_size rollouts: anchors and extra
    dynamic-sampling rounds add more. Rollouts decode gen.batch_size at a time, or as many as
    gen.kv_budget_gib holds at full length (what the decoder does, generation/backends.py)."""
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
    examples = sft_examples(preset)
    example_tokens = min(preset.sft.max_length, prompt_tokens + response_fraction * preset.distill.max_trajectory_tokens)
    sft_run_s = preset.sft.epochs * examples * example_tokens / (sft_tokens / sft_s)
    rl_run_s = rl.steps * (rollout_s + update_s)
    screen_s = decode_seconds(preset, shape, sum(rl.pool.values()) * rl.pool_samples, prompt_tokens, response, gpus,
                              spec, bandwidth_efficiency, mfu)[0]
    capture_s = capture_seconds(preset, shape, gpus, spec, bandwidth_efficiency, mfu, prompt_tokens)
    eval_s = eval_seconds(preset, shape, gpus, spec, response, bandwidth_efficiency, mfu, prompt_tokens)
    train_s = sft_run_s + screen_s + rl_run_s
    return StepTime(
        gpu=spec.name, gpus=gpus, sft_tokens_per_step=sft_tokens, sft_flops_per_token=sft_per_token,
        sft_seconds=sft_s, sft_tokens_per_s=sft_tokens / sft_s, rl_rollouts=rollouts, rl_response_tokens=response,
        rl_rollout_seconds=rollout_s, rl_rollout_bound=bound, rl_update_tokens=update_tokens,
        rl_update_seconds=update_s, rl_step_seconds=rollout_s + update_s, rl_steps=rl.steps,
        rl_run_hours=rl_run_s / 3600, sft_epochs=preset.sft.epochs, sft_examples=examples, sft_example_tokens=example_tokens,
        sft_run_hours=sft_run_s / 3600, pool_candidates=sum(rl.pool.values()),
        pool_samples=rl.pool_samples, pool_screen_hours=screen_s / 3600,
        total_hours=train_s / 3600,
        capture_hours=None if capture_s is None else capture_s / 3600, eval_hours=eval_s / 3600,
        afternoon_hours=(train_s + (capture_s or 0.0) + eval_s) / 3600,
        **_alone_fields(preset, shape, spec),
        **_teacher_fields(preset, shape),
        assumptions=dict(mfu=mfu, update_mfu=update_mfu, bandwidth_efficiency=bandwidth_efficiency,
                         response_fraction=response_fraction, prompt_tokens=prompt_tokens,
                         old_logprob_fraction=old_logprob_fraction(preset)),
    )
