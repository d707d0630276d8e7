"""Presets: the ONLY place where scale differs.

The same functions run a laptop-CPU demo, a 3B QLoRA run on one GPU and a multi-node 32B
run; a preset is a tree of dataclasses and nothing else reads hidden settings. Pick one by
name and override fields:

    preset = get_preset("cpu-tiny", sft={"epochs": 1}, rl={"steps": 2})
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from coa_lab.field_types import checked_value

EMBEDDED_MODEL = "embedded:smollm2-135m-instruct"


@dataclass
class ModelConfig:
    name: str = EMBEDDED_MODEL  # "embedded:...", a local path, or any Hugging Face model id
    dtype: str = "float32"  # weights; CPU keeps fp32 master weights ...
    cpu_autocast_bf16: bool = True  # ... and computes in bf16 where the CPU has bf16 units (models.cpu_bf16_is_fast)
    load_in_4bit: bool = False  # QLoRA through bitsandbytes (GPU extra)
    use_unsloth: bool = False  # unsloth's fused kernels (GPU extra)
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    gradient_checkpointing: bool = False


@dataclass
class GenerationConfig:
    # "hf" (coa_lab.generation.decoding over any transformers model), "vllm" (an in-process engine on this
    # GPU; GPU extra), "vllm-server" (a separate `vllm serve` at server_url, e.g. its own node
    # with tensor parallelism; RL pushes each new LoRA adapter to it; docs/scaling.md) or "auto"
    # (vLLM where it is installed and a GPU is present, else "hf": generation/backends.py)
    backend: str = "hf"
    # "vllm" in-process shares the GPU with the trainer: the engine's share of GPU memory (weights
    # + KV cache); the policy being trained needs the rest. None: from the plan of this preset on
    # this card (planning.memory_plan.rl_on_one_card; 0.5 where the model's shape is unknown)
    vllm_memory_fraction: float | None = None
    server_url: str | None = None  # "vllm-server": the server's OpenAI-compatible base, ".../v1"
    server_api_key_env: str = "VLLM_API_KEY"  # the key is read from this variable, never the preset
    # per turn: generation pauses at every tool call. Must exceed the longest turn in the SFT
    # data (105 tokens up to </code> in the demo's kept runs): at 96 the student's correct
    # level-3 programs were cut off before their closing tag and scored 0.
    max_new_tokens: int = 160
    max_turns: int = 3  # tool calls + final answer
    max_response_tokens: int = 320  # whole trajectory budget (model + observation tokens)
    top_p: float = 1.0
    # rows decoded together. On CPU a decode step's matmuls get ~3x more done per token at 64
    # rows than at 8 (benchmarks/bench_rollouts.py), and finished rows leave the batch
    batch_size: int = 64
    # the rows decoded at once from a KV-cache budget instead (GiB): as many full-length rows
    # (prompt + max_response_tokens) as fit, at most batch_size (generation/backends.py; the
    # planner sizes the same way). None: batch_size rows.
    kv_budget_gib: float | None = None
    observation_chars: int = 300  # tool output is truncated before it enters the context
    # a tool call that has not answered by then becomes an error observation and the rollout
    # goes on: one hung tool (a dead search backend, a hand-written tool) never stalls the batch
    tool_timeout_s: float = 60.0


# Task mixes are "suite/benchmark" -> number of tasks (coa_lab.tasks.suites names both).
# The CPU presets use the learnable families (tools carry the weight); GSM8K / HotpotQA stay
# in their evaluation as the honest hard rows.
LEARNABLE_MIX = {"math/arith": 48, "mhqa/lookup": 16}
# The reported test mix: 192 learnable tasks resolve about +-3.5 points (one standard error
# at p ~ 0.7), where the 64 of earlier runs resolved +-6, more than the effects RL was claimed to have.
TEST_MIX = {"math/arith": 144, "mhqa/lookup": 48}


@dataclass
class CaptureConfig:
    # from the train splits; more arithmetic than look-ups: the 135M teacher solves ~90% of
    # the former and ~33% of the latter (demo, 2026-11-23), and every look-up relation needs a
    # few kept runs or the student answers that kind of question in prose (measured at 16)
    tasks: dict[str, int] = field(default_factory=lambda: {"math/arith": 48, "mhqa/lookup": 24})
    max_hops: int = 1  # tool-agent activations per teacher run
    # A share of further train tasks the teacher runs with `multi_hop_hops` tool hops each (its
    # thinker asked for a next step after every reflection), drawn from the far end of the
    # shuffled train split so that they never meet the capture tasks or the RL pool. Their runs
    # are source "teacher-<n>hop" in the funnel: where a small teacher's self-corrections
    # happen, and where the reflection filter has something to judge (docs/design.md).
    multi_hop_tasks: dict[str, int] = field(default_factory=dict)
    multi_hop_hops: int = 2
    teacher_model: str | None = None  # None: the preset's model; or any model name / path
    teacher_max_new_tokens: int = 40  # per agent call: the agents are few-shot and terse
    few_shot: int = 2  # worked examples per agent prompt (capture/worked_examples.py)
    # A remote teacher: any OpenAI-compatible base URL (".../v1"; `coa-lab serve`, `vllm serve`,
    # Ollama, a hosted API); teacher_model is then the model name sent. The key is read from the
    # environment variable named here, never from the preset.
    teacher_url: str | None = None
    teacher_api_key_env: str = "OPENAI_API_KEY"
    concurrency: int = 8  # remote teacher: runs (and so requests) in flight at once
    max_retries: int = 6  # remote teacher: per request, on 429 / 5xx / timeouts
    # local teacher: tasks run in lockstep (one batched generate per agent) and flushed to
    # traces.jsonl together; more tasks than this are split into equal batches
    batch_tasks: int = 64


@dataclass
class DistillConfig:
    min_tool_calls: int = 1  # complexity filter: at least one tool hop ...
    max_tool_calls: int = 8  # ... and a bounded number
    # Real external trajectories (FireAct, ToRA, R1-Searcher): this many from each shipped file
    # whose suite the preset trains (datasets/trajectories/). The CPU demo takes 8 of each for
    # its funnel; the GPU presets 250 for their real benchmarks.
    imported_per_suite: int = 0
    # which shipped sources those come from (ImportedTrajectory.source: "fireact", "r1searcher", "tora")
    imported_sources: tuple[str, ...] = ("fireact", "r1searcher", "tora")
    max_trajectory_tokens: int = 384


@dataclass
class SFTConfig:
    epochs: float = 5.0
    learning_rate: float = 2e-4  # LoRA; the paper's full fine-tune uses 1e-5 .. 3e-5
    # small batches: ~25 kept trajectories need ~50 optimizer steps before the 135M student
    # writes the format reliably (measured: 18 steps of 4 were not enough)
    batch_size: int = 2
    grad_accum: int = 1
    max_length: int = 768  # prompt + trajectory
    warmup_ratio: float = 0.05
    # False gives observation tokens their labels too: the ablation (notebook 07) that shows
    # what the mask is for. Every real run keeps it True, as the paper does.
    mask_observations: bool = True
    # a checkpoint (adapter, optimizer, scheduler, step, RNG and data-order state) every this
    # many optimizer steps, the last 2 kept; `coa-lab sft --resume` continues from the newest
    save_steps: int = 50


@dataclass
class RLConfig:
    steps: int = 8
    prompts_per_step: int = 3
    group_size: int = 8  # the paper's
    # a LoRA's rate (the paper's full-model lr is 1e-6), chosen on validation: 2e-4 collapsed (docs/design.md)
    learning_rate: float = 5e-5
    clip_low: float = 0.2  # DAPO clip-higher: asymmetric range
    clip_high: float = 0.28
    # optimizer steps per sampled batch; >1 moves the ratio off 1, so clipping matters (4 collapsed)
    mini_batches: int = 2
    dynamic_sampling: bool = True
    # "token": DAPO's token-level loss (every policy token of the batch weighs the same);
    # "sequence": GRPO's per-sample mean, then the mean over samples (the ablation in notebook 07)
    loss_agg: str = "token"
    max_sampling_rounds: int = 1  # extra draws to refill groups that had no signal
    overlong_buffer: int = 64  # soft overlong punishment window before max_response_tokens
    overlong_filter: bool = True  # mask truncated samples out of the loss
    temperature: float = 0.8  # DAPO samples at 1.0; a 135M policy degrades fast above ~0.8
    # A trajectory that breaks the CoA grammar earns 0 (an AFM run aborts on a format error).
    # Off, RL on cpu-tiny taught the student to skip the <think> before <answer>: look-up format
    # validity on validation 0.97 -> 0.72 (rl/rollouts.rollout_reward, docs/design.md)
    format_reward: bool = True
    # The RL pool, chosen as the paper does: candidates from the train splits (after the
    # capture tasks) are sampled `pool_samples` times by the SFT model, and those it solves
    # sometimes but not always (pass rate in [pool_min_pass, pool_max_pass]) are kept.
    # 64 candidates: from 32, ~14 questions were kept, each drawn 3-4 times, and RL reinforced their wording
    pool: dict[str, int] = field(default_factory=lambda: {"math/arith": 48, "mhqa/lookup": 16})
    pool_samples: int = 4
    # half the samples first, the rest only where undecided (two that disagree make a 4-sample rate 1/4..3/4)
    pool_adaptive: bool = True
    pool_min_pass: float = 0.2
    pool_max_pass: float = 0.8
    # Anchors: candidates the SFT model solved every time, sampled beside the pool each step. Their
    # groups stay all-right (dropped by dynamic sampling) unless the policy drifts from what SFT
    # did well; then they turn mixed and the update pulls back (docs/design.md).
    anchors_per_step: int = 3  # drawn round-robin over question templates (rl.pool.anchor_stream)
    save_steps: int = 1  # a checkpoint (adapter, optimizer, step, RNG, task stream) every this many steps; --resume
    # RL's own seed (pool screening samples, task order, anchors, rollouts); None: the preset's
    # seed. The tasks themselves (pool candidates, eval) are drawn with the preset's seed, so
    # benchmarks/bench_rl_seeds.py varies only RL from one SFT adapter on one pool of candidates.
    seed: int | None = None
    rollout_int8: bool | str = False  # int8 sampler copy (rl/int8_rollouts.py): True all Linears, "attention" q/k/v/o
    # Truncated importance sampling on the sampler's log-probs: every sampler reports them (int8 copy,
    # the lab's decoder; in-process vLLM asks logprobs=0 after temperature, logprobs_mode processed_logprobs;
    # the server client asks logprobs=0 too), so it runs on the GPU presets. Each policy token's loss x
    # min(pi_train / pi_rollout, tis_cap); exact fp32 rollouts weigh 1, bf16 autocast ones correct a LoRA
    # merged in the sampler against unmerged in the trainer. None: no correction (the ablation's third arm).
    tis_cap: float | None = 2.0
    # A KL term to the SFT policy (the adapter RL starts from), GRPO's k3 estimator per policy
    # token, weighed by kl_coef and averaged like the loss. 0: none, as in DAPO and the AFM
    # release. A guard against drift, chosen (or not) on the validation split (docs/design.md).
    kl_coef: float = 0.0
    # InstructGPT's PPO-ptx, with the SFT data as the mix: every optimizer step adds sft_coef x
    # the masked SFT loss on sft_rows trajectories of the distilled set (distill/kept.jsonl). Why:
    # one LoRA update serves every question template, and a phrase rewarded on one spread to others
    # SFT had solved (docs/design.md, "The SFT loss in every update"; the measurement: docs/history.md). 0: off.
    sft_coef: float = 0.0
    sft_rows: int = 8
    # The policy-gradient term's weight: 1 is RL. 0 is the SFT-only control of an RL run: no
    # rollouts, the same optimizer steps (rl.mini_batches a step), the same SFT rows in the same
    # order at the same rate (needs rl.sft_coef > 0). What RL itself adds is the recipe's gain
    # over this control, not over the SFT adapter (benchmarks/bench_rl_seeds.py --arms).
    pg_coef: float = 1.0
    warmup_steps: int = 0  # linear warm-up, in optimizer steps (rl/optim.py; docs/design.md "RL: the optimizer")
    lr_schedule: str = "constant"  # after the warm-up: "constant" | "cosine" | "linear" (to 0 at the run's end)
    advantage: str = "grpo"  # "grpo" (r - mean) / std | "dr_grpo" r - mean | "rft" 1 correct, 0 wrong (rl/dapo.py)


@dataclass
class EvalConfig:
    # held-out tasks, "suite/benchmark" -> n. The learnable families are the headline; GSM8K
    # and HotpotQA are the honest hard rows a 135M model does not solve.
    # the TEST split (reported, never tuned on; datasets/README.md): the learnable families, and
    # the hard rows whose benchmarks have no validation split of their own
    tasks: dict[str, int] = field(default_factory=lambda: {**TEST_MIX, "math/gsm8k": 4, "mhqa/hotpotqa": 4})
    # the VALIDATION split: every tuning decision reads this (docs/design.md); {} skips it
    val_tasks: dict[str, int] = field(default_factory=lambda: dict(LEARNABLE_MIX))
    headline: tuple[str, ...] = ("math/arith", "mhqa/lookup")  # what summary.json's figures are measured on
    teacher: bool = True  # also run the multi-agent teacher on the headline tasks (cost comparison)
    samples: int = 1  # k for pass@k / avg@k; 1 = greedy
    temperature: float = 0.0


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
    """`make demo-full`: the whole measured recipe, every stage for real on the embedded 135M model:
    56 min on a 2-core machine with bf16 units (docs/results/demo.json); `make demo` runs less of it
    (cpu-quick)."""
    # Each choice below was measured on the validation split; docs/design.md has the figures.
    # RL: 6 questions x 4 samples a step: with 3 x 8 a step's gradient came from 1-3 question
    # templates and one template's reasoning spread to others. The SFT loss mixed into RL
    # (PPO-ptx, sft_coef) at lr 1e-4. The funnel: two-hop teacher runs give the reflection
    # filter something to judge; 8 real search trajectories per source meet the other filters; at
    # most 2 tool calls, the student's turn budget (gen.max_turns = 3); not ToRA (its GSM8K
    # programs cost the student arithmetic).
    return Preset(name="cpu-tiny",
                  capture=CaptureConfig(multi_hop_tasks={"math/arith": 8, "mhqa/lookup": 4}),
                  distill=DistillConfig(imported_per_suite=8, imported_sources=("fireact", "r1searcher"), max_tool_calls=2),
                  rl=RLConfig(prompts_per_step=6, group_size=4, sft_coef=1.0, learning_rate=1e-4))


def _cpu_quick() -> Preset:
    """`make demo`: the cpu-tiny recipe (the same capture, filters, SFT and RL settings), less of
    it: RL 4 steps from a pool screened out of 32 candidates, evaluation on 64 + 4 test tasks
    without the validation split. Every stage still does real work on the embedded model; what
    it cannot do is resolve RL's effect: on 64 tasks the paired standard error of RL − SFT
    was 4.7 points (docs/results/demo_cpu-quick.json), above RL's mean effect of 2.5 across 5
    seeds x 192 tasks of the full recipe (docs/results/rl_seeds.json). `make demo-full` runs cpu-tiny itself (docs/results.md: both measured)."""
    preset = _cpu_tiny()
    preset.name = "cpu-quick"
    preset.rl = dataclasses.replace(preset.rl, steps=4, pool={"math/arith": 24, "mhqa/lookup": 8})
    preset.eval = EvalConfig(tasks={"math/arith": 48, "mhqa/lookup": 16, "math/gsm8k": 2, "mhqa/hotpotqa": 2},
                             val_tasks={})
    return preset


def _cpu_smoke() -> Preset:
    """The test suite's and notebooks' smoke mode: every stage runs, as small as it can."""
    return Preset(
        name="cpu-smoke",
        gen=GenerationConfig(max_new_tokens=48, max_turns=2, max_response_tokens=160, batch_size=8),
        capture=CaptureConfig(tasks={"math/arith": 2, "mhqa/lookup": 2}, max_hops=1, teacher_max_new_tokens=32,
                              multi_hop_tasks={"math/arith": 1}),
        distill=DistillConfig(imported_per_suite=2, max_tool_calls=2, max_trajectory_tokens=320),
        sft=SFTConfig(epochs=1, batch_size=4, max_length=320),
        rl=RLConfig(steps=1, prompts_per_step=2, group_size=2, max_sampling_rounds=0, overlong_buffer=32,
                    pool={"math/arith": 2, "mhqa/lookup": 2}, pool_samples=2),
        eval=EvalConfig(tasks={"math/arith": 2, "mhqa/lookup": 2, "math/gsm8k": 1, "mhqa/hotpotqa": 1},
                        val_tasks={"math/arith": 1, "mhqa/lookup": 1}),
    )


def _gpu_smoke() -> Preset:
    """The embedded 135M model on any CUDA GPU, every stage: the cpu-tiny recipe (its filters, SFT
    and RL settings) with what a GPU is for: four times the capture, a pool screened from 128
    candidates at 8 samples each, and RL at 16 questions x 8 samples a step (~1,300 rollouts a
    run against cpu-tiny's ~330), in bf16, or loss-scaled fp16 on a card without bf16 such as a
    T4 (models.effective_dtype). Validation is the arms benchmark's 224 tasks.
    On an H100 (docs/gpu-validation.md; then 16 RL steps, 256 candidates) capture, distillation,
    SFT and pool screening ran; RL and evaluation have not yet."""
    preset = _cpu_tiny()
    preset.name = "gpu-smoke"
    preset.model = ModelConfig(dtype="bfloat16")
    preset.gen = dataclasses.replace(preset.gen, batch_size=256)
    preset.capture = dataclasses.replace(preset.capture, tasks={"math/arith": 192, "mhqa/lookup": 96},
                                         multi_hop_tasks={"math/arith": 32, "mhqa/lookup": 16})
    # batch 8: at cpu-tiny's 2 the Trainer's per-step overhead set SFT's time (docs/gpu-validation.md)
    preset.sft = dataclasses.replace(preset.sft, batch_size=8)
    # sized so `coa-lab plan --preset gpu-smoke --gpu T4` puts the whole recipe under 15 min
    preset.rl = dataclasses.replace(preset.rl, steps=8, prompts_per_step=16, group_size=8, anchors_per_step=4,
                                    pool={"math/arith": 96, "mhqa/lookup": 32}, pool_samples=8)
    preset.eval = dataclasses.replace(preset.eval, val_tasks={"math/arith": 160, "mhqa/lookup": 64})
    return preset


def _gpu_3b_qlora() -> Preset:
    """One 24 GB GPU (L4, A10): Qwen2.5-3B-Instruct, 4-bit QLoRA, the paper's group size. `coa-lab
    plan --preset gpu-3b-qlora --gpu L4` (docs/results/plan_gpu_3b_l4.json): SFT + screening + RL and
    the whole recipe with the local teacher's capture and evaluation (docs/scaling.md)."""
    return Preset(
        name="gpu-3b-qlora",
        model=ModelConfig(name="Qwen/Qwen2.5-3B-Instruct", dtype="bfloat16", load_in_4bit=True,
                          use_unsloth=True, lora_r=64, lora_alpha=128, gradient_checkpointing=True),
        # vLLM where installed, else the lab's decoder. During RL vLLM's own 16-bit copy (5.8 GiB) and a
        # 2.5 GiB KV budget (35 full-length rows) sit beside the trainer: 18.2 GiB, x1.3 fits 24 GiB. A 1,536-
        # token response budget over up to 8 turns: GSM8K and HotpotQA trajectories of the capture fit in it.
        gen=GenerationConfig(backend="auto", max_new_tokens=1024, max_turns=8,
                             max_response_tokens=1536, batch_size=256, kv_budget_gib=2.5, observation_chars=1500),
        capture=CaptureConfig(tasks={"math/gsm8k": 500, "mhqa/hotpotqa": 400}, max_hops=6, teacher_max_new_tokens=1024),
        # at most 1,400 trajectories x 2 epochs of ~1.5k tokens: ~83 min of SFT on an L4 (planned)
        distill=DistillConfig(imported_per_suite=250, max_trajectory_tokens=2048),
        sft=SFTConfig(epochs=2, learning_rate=1e-4, batch_size=4, grad_accum=8, max_length=2560, warmup_ratio=0.03),
        # 30 steps x 8 prompts x 8 samples = 1,920 rollouts over 240 prompt draws, one optimizer step
        # each (~4.3 min a step planned on an L4, the update most of it). The rate is LoRA's:
        # the paper's 1e-6 is a full fine-tune's, and 30 steps at it would not move an adapter.
        rl=RLConfig(steps=30, prompts_per_step=8, group_size=8, learning_rate=5e-6,
                    mini_batches=1, max_sampling_rounds=2, overlong_buffer=256, temperature=1.0,
                    pool={"math/gsm8k": 120, "mhqa/hotpotqa": 80}, pool_samples=4, pool_min_pass=0.1, pool_max_pass=0.9),
        eval=EvalConfig(tasks={"math/gsm8k": 200, "mhqa/hotpotqa": 200, "mhqa/2wiki": 200, "math/math500": 500},
                        headline=("math/gsm8k", "mhqa/hotpotqa"), samples=3, temperature=0.6, val_tasks={}),
    )


def _colab_t4() -> Preset:
    """Colab's free 16 GB T4, which has no bf16: fp16 there (models.effective_dtype), so Llama-3.2-1B-Instruct,
    not Qwen2/2.5, whose fp16 activations overflow to NaN (docs/colab.md); 4-bit QLoRA, its own teacher
    unless capture.teacher_url names a stronger one; `coa-lab plan --preset colab-t4 --gpu T4`. Never run yet."""
    return Preset(
        name="colab-t4",
        model=ModelConfig(name="meta-llama/Llama-3.2-1B-Instruct", dtype="bfloat16", load_in_4bit=True, lora_r=32,
                          lora_alpha=64, gradient_checkpointing=True),
        # 3 GiB of KV: 64 full-length rows, one RL step's rollouts at once, beside vLLM's 16-bit copy and the trainer
        gen=GenerationConfig(backend="auto", max_new_tokens=512, max_turns=6, max_response_tokens=1024,
                             batch_size=128, kv_budget_gib=3.0, observation_chars=1000),
        capture=CaptureConfig(tasks={"math/gsm8k": 150, "mhqa/hotpotqa": 100}, max_hops=3, teacher_max_new_tokens=384),
        distill=DistillConfig(imported_per_suite=100, max_trajectory_tokens=1536),
        sft=SFTConfig(epochs=2, learning_rate=1e-4, batch_size=4, grad_accum=4, max_length=2048, warmup_ratio=0.03),
        rl=RLConfig(steps=12, prompts_per_step=8, group_size=8, learning_rate=5e-6, mini_batches=1, overlong_buffer=128,
                    temperature=1.0, pool={"math/gsm8k": 64, "mhqa/hotpotqa": 32}, pool_min_pass=0.1, pool_max_pass=0.9),
        eval=EvalConfig(tasks={"math/gsm8k": 100, "mhqa/hotpotqa": 100}, headline=("math/gsm8k", "mhqa/hotpotqa"),
                        val_tasks={}, teacher=False))


def _multinode_32b() -> Preset:
    """Many nodes: the paper's full 32B fine-tune for SFT under `accelerate launch` with DeepSpeed
    ZeRO-3 (configs/zero3.yaml); RL as a LoRA on that model, data parallel, sampling from a
    separate `vllm serve` node with tensor parallelism (configs/slurm/multinode_32b.sbatch;
    docs/scaling.md). Full-parameter RL is not supported (no weight broadcast into vLLM)."""
    return Preset(
        name="multinode-32b",
        model=ModelConfig(name="Qwen/Qwen2.5-32B-Instruct", dtype="bfloat16", lora_r=0,
                          gradient_checkpointing=True),
        # rollouts from a `vllm serve` node (server_url is set by the launch script:
        # configs/slurm/multinode_32b.sbatch); RL trains a LoRA on the SFT model (--set model.lora_r=64)
        gen=GenerationConfig(backend="vllm-server", max_new_tokens=4096, max_turns=25,
                             max_response_tokens=30000, batch_size=512, observation_chars=1500),
        capture=CaptureConfig(tasks={"math/gsm8k": 500, "mhqa/hotpotqa": 400}, max_hops=12, teacher_max_new_tokens=4096),
        distill=DistillConfig(imported_per_suite=0, max_trajectory_tokens=32768),
        sft=SFTConfig(epochs=3, learning_rate=2e-5, batch_size=1, grad_accum=16, max_length=32768, warmup_ratio=0.03),
        rl=RLConfig(steps=300, prompts_per_step=64, group_size=8, learning_rate=1e-6,
                    mini_batches=8, max_sampling_rounds=8, overlong_buffer=4096, temperature=1.0,
                    pool={"math/gsm8k": 500, "mhqa/hotpotqa": 400}, pool_samples=8, pool_min_pass=0.1, pool_max_pass=0.9),
        eval=EvalConfig(tasks={"math/gsm8k": 200, "mhqa/hotpotqa": 200, "mhqa/2wiki": 200, "math/math500": 500,
                               "math/aime24": 30}, headline=("math/gsm8k", "mhqa/hotpotqa"), samples=16, temperature=0.6,
                        val_tasks={}),
    )


PRESETS = {
    "cpu-tiny": _cpu_tiny,
    "cpu-quick": _cpu_quick,
    "cpu-smoke": _cpu_smoke,
    "gpu-smoke": _gpu_smoke,
    "gpu-3b-qlora": _gpu_3b_qlora,
    "colab-t4": _colab_t4,
    "multinode-32b": _multinode_32b,
}


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
