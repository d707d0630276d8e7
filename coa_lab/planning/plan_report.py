"""The planner against the real GPU runs (docs/gpu-validation.json), and the whole plan as
`coa-lab plan` prints it: memory (coa_lab/planning/memory_plan.py), whether it fits, time
(coa_lab/planning/step_time.py)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from coa_lab.config import Preset, get_preset
from coa_lab.generation.engine_share import IN_PROCESS_ENGINE, MEMORY_MARGIN
from coa_lab.generation.model_shape import ModelShape, shape_of
from coa_lab.paths import PROJECT_ROOT
from coa_lab.planning.memory_plan import fit_verdict, params_of, plan, rl_on_one_card, weight_bytes
from coa_lab.planning.preset_check import TARGET_CARDS, rl_update_preset
from coa_lab.planning.step_time import (
    BANDWIDTH_EFFICIENCY,
    SFT_MFU,
    UPDATE_MFU,
    GPUSpec,
    decode_seconds,
    gpu_spec,
    step_time,
    update_seconds,
)
from coa_lab.recipe_check import data_problems
from coa_lab.training.lm_head import CHUNK

# --- calibration against the real GPU runs ---------------------------------------------------

VALIDATION_JSON = PROJECT_ROOT / "docs" / "gpu-validation.json"  # H100, 2026-11-23 (before chunking)
VALIDATION_JSON_CHUNKED = PROJECT_ROOT / "docs" / "results" / "gpu_validation_h200.json"  # the H200 run of 2026-11-26
# the same H200 kind after the GPU autocast fix (models.compute_context): bf16 activations in the update
VALIDATION_JSON_AUTOCAST = PROJECT_ROOT / "docs" / "results" / "gpu_validation_h200_autocast.json"
VALIDATION_RUNS = (VALIDATION_JSON, VALIDATION_JSON_CHUNKED, VALIDATION_JSON_AUTOCAST)
# The errors stated for the defaults (tests/planning/test_memory_plan.py holds calibration() to them):
SFT_TOKENS_PER_S_ERROR = 0.40  # |predicted / measured - 1| of SFT tokens/s
UPDATE_SECONDS_ERROR = 0.20  # the same for the DAPO update's seconds
MEMORY_RATIO_RANGE = (0.75, 1.30)  # predicted / measured peak memory


@dataclass
class CalibrationRow:
    run: str
    quantity: str  # "sft_tokens_per_s", "update_seconds", "decode_tokens_per_s", "peak_gib"
    predicted: float
    measured: float

    @property
    def ratio(self) -> float:
        return self.predicted / self.measured


def run_gpu(data: dict) -> str:
    """The GPUS name of the card a results file ran on (its versions.gpu, as torch names it);
    files without one are the H100 runs of 2026-11-23."""
    name = data.get("versions", {}).get("gpu", "H100").upper()
    return next((g for g in ("H200", "H100", "A100", "L4", "A10", "T4") if g in name), "H100")


def calibration(path: Path = VALIDATION_JSON, gpu: GPUSpec | str | None = None, mfu: float = SFT_MFU,
                update_mfu: float = UPDATE_MFU,
                bandwidth_efficiency: float = BANDWIDTH_EFFICIENCY) -> list[CalibrationRow]:
    """Predicted against measured for every run in docs/gpu-validation.json (benchmarks/gpu_validate.py).

    Those runs: the Qwen2.5-3B shape, LoRA r=64 on all linear layers, checkpointing, on one GPU
    (`gpu`; None: the one the file names, run_gpu).
    SFT at batch 1 and the given context. The DAPO update ran at commit 19694f8, whose
    policy_update computed old log-probs for all 8 rollouts (micro-batches of 4, no grad), then
    trained 4 mini-batches of 2: its peak memory is set by the larger logits of the no-grad pass
    (2 + 4 + 4 bytes per position, plan()'s logits term), so it is compared with plan() at a
    micro-batch of 4 x (prompt + response). Rollouts came from HF generate (batch 8, PEFT-wrapped,
    short chat prompts taken as 64 tokens): launch-bound, far from the bandwidth bound modelled here.

    Runs of benchmarks/gpu_validate.py since the chunked LM head name their LM head (`lm_head`:
    "plain" = every position's logits, planned with logits_chunk=None; "chunked" and "fused" planned
    with one chunk); a run without the field predates chunking ("plain"). Its DAPO update has no
    old-log-prob pass (gpu-3b-qlora takes one optimizer step per batch), so its peak is a training
    micro-batch of update.MICRO_BATCH rollouts; its rollouts (`decode`) come from the lab's decoder.
    Entries without a measured peak (an OOM) are skipped."""
    data = json.loads(Path(path).read_text())
    spec = gpu_spec(gpu or run_gpu(data))
    shape = shape_of("Qwen/Qwen2.5-3B-Instruct")
    rows = []

    def preset_for(four_bit: bool, batch: int, length: int) -> Preset:
        base = get_preset("gpu-3b-qlora")
        return replace(base, model=replace(base.model, load_in_4bit=four_bit, use_unsloth=False),
                       sft=replace(base.sft, batch_size=batch, grad_accum=1, max_length=length))

    from coa_lab.rl.update import MICRO_BATCH  # (torch: only when calibrating)

    def chunk_of(r: dict) -> int | None:
        return None if r.get("lm_head", "plain") == "plain" else CHUNK

    def head_label(r: dict) -> str:
        return f", {r['lm_head']} head" if "lm_head" in r else ""

    def policy_bytes(p: Preset) -> float:  # these runs decoded the trainer's own model, never a vLLM engine
        return weight_bytes(p.model, shape, params_of(p, shape))

    for r in data["sft"]:
        if r.get("peak_mem_gib") is None:
            continue
        label = f"SFT {r['context']:,} tok, {'4-bit' if r['four_bit'] else 'bf16'}{head_label(r)}"
        p = preset_for(r["four_bit"], 1, r["context"])
        rows.append(CalibrationRow(label, "sft_tokens_per_s",
                                   step_time(p, 1, spec, shape, mfu=mfu).sft_tokens_per_s, r["tokens_per_s"]))
        rows.append(CalibrationRow(label, "peak_gib", plan(p, 1, shape, logits_chunk=chunk_of(r)).train_total_gib,
                                   r["peak_mem_gib"]))
    for r in data["rl"]:
        d, g = r["dapo"], r.get("generation")
        if d.get("peak_mem_gib") is None:
            continue
        weights = "4-bit" if d["four_bit"] else "bf16"
        label = f"DAPO {d['group_size']} x ({d['prompt_len']} + {d['response_len']}), {weights}{head_label(d)}"
        length = d["prompt_len"] + d["response_len"]
        no_old_logprobs = "lm_head" in d  # no old-log-prob pass; micro-batches of MICRO_BATCH rollouts
        p = preset_for(d["four_bit"], MICRO_BATCH if no_old_logprobs else 4, length)
        _, seconds = update_seconds(p, shape, d["group_size"], length, 0.0 if no_old_logprobs else 1.0, 1, spec,
                                    update_mfu)
        rows.append(CalibrationRow(label, "update_seconds", seconds, d["seconds"]))
        rows.append(CalibrationRow(label, "peak_gib", plan(p, 1, shape, logits_chunk=chunk_of(d)).train_total_gib,
                                   d["peak_mem_gib"]))
        if g is not None:
            per_row = g["new_tokens"] / g["batch"]
            p = replace(p, gen=replace(p.gen, batch_size=g["batch"], kv_budget_gib=None))  # the measured batch
            seconds, _ = decode_seconds(p, shape, g["batch"], 64, per_row, 1, spec, bandwidth_efficiency, mfu,
                                        weights=policy_bytes(p))
            rows.append(CalibrationRow(f"HF generate, batch {g['batch']}, {weights}",
                                       "decode_tokens_per_s", g["new_tokens"] / seconds, g["tokens_per_s"]))
    for g in data.get("decode", []):  # the lab's decoder, gpu-3b-qlora's policy (4-bit + LoRA)
        p = preset_for(True, 1, 1024)
        p = replace(p, gen=replace(p.gen, batch_size=g["batch"], kv_budget_gib=None))  # the measured batch
        seconds, _ = decode_seconds(p, shape, g["batch"], 64, g["new_tokens"], 1, spec, bandwidth_efficiency, mfu,
                                    weights=policy_bytes(p))
        rows.append(CalibrationRow(f"lab decoder, batch {g['batch']}, 4-bit", "decode_tokens_per_s",
                                   g["batch"] * g["new_tokens"] / seconds, g["tokens_per_s"]))
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
    # RL's update is priced as RL runs it (one packed micro-batch of full-length rollouts, the model RL
    # trains), not as SFT's batch: preset_check.rl_update_preset
    rl_memory = plan(rl_update_preset(preset), gpus, shape)
    times = step_time(preset, gpus, spec, shape, **assumptions)
    m = preset.model
    return {
        "preset": preset.name, "gpus": gpus, "gpu": asdict(spec),
        "model": {"name": m.name, "params": memory.params, "trainable": memory.trainable,
                  "lora_r": m.lora_r, "load_in_4bit": m.load_in_4bit, "dtype": m.dtype,
                  "gradient_checkpointing": m.gradient_checkpointing},
        # who holds the rollouts' weights: an in-process vLLM engine (its own copy) or the policy itself
        "sampler": ("vllm-engine" if preset.gen.backend in IN_PROCESS_ENGINE else
                    "vllm-server" if preset.gen.backend == "vllm-server" else "policy"),
        "memory_gib": memory.to_dict(),
        # the model RL trains where its launch script changes it (preset_check.TARGET_CARDS)
        "rl_model": ", ".join(f"{k}={v}" for k, v in TARGET_CARDS[preset.name].rl_model)
                    if preset.name in TARGET_CARDS else "",
        "fits": {"train": fit_verdict(memory.train_total_gib, spec.memory_gib),
                 # a vLLM server decodes on its own node(s): the trainer's cards hold no rollouts
                 "rollout": ("on the server" if preset.gen.backend == "vllm-server"
                             else fit_verdict(memory.rollout_total_gib, spec.memory_gib)),
                 "margin": MEMORY_MARGIN,
                 "rl_train": fit_verdict(rl_memory.train_total_gib, spec.memory_gib),
                 "rl_train_gib": round(rl_memory.train_total_gib, 2),
                 # RL with vLLM in the same process: trainer and sampler on one card at once
                 **rl_on_one_card(rl_memory, spec.memory_gib)},
        "time": times.to_dict(),
        # whether the recipe's data feeds every stage (pools, splits, files): recipe_check.data_problems
        "recipe_problems": data_problems(preset),
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


def _alone_line(r: dict) -> str:
    """How many rows capture and evaluation decode at once, and why: an in-process engine has the
    card alone there (engine_share.engine_alone), the lab's decoder keeps gen.kv_budget_gib's rows."""
    t, rows = r["time"], r["time"]["eval_rows"]
    teacher = t["capture_rows"] if t["capture_rows"] not in (None, rows) else None
    extra = f", the teacher {teacher}" if teacher else ""
    if r["sampler"] == "vllm-server":
        return (f"  {'capture and evaluation decode':<36} {rows:>9}   rows at once{extra}: sent to the vLLM server, "
                "which batches them")
    if t["engine_alone_share"] is None:
        return (f"  {'capture and evaluation decode':<36} {rows:>9}   rows at once{extra}: the lab's decoder "
                "keeps RL's KV budget")
    return (f"  {'capture and evaluation decode':<36} {rows:>9}   rows at once{extra}: engine alone on the card "
            f"(share {t['engine_alone_share']:g}; RL's {r['memory_gib']['rollout_batch']} beside the trainer)")


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
    if r["sampler"] == "vllm-server":
        lines.append(f"  {'rollouts':<36} {'-':>9}   a vLLM server on its own node(s) decodes them: vLLM sizes "
                     "its KV cache there (docs/scaling.md)")
    else:
        own_copy = "vLLM's own copy, unquantized" if r["sampler"] == "vllm-engine" else "the policy's own"
        lines.append(f"  {'weights the sampler holds':<36} {mem['rollout_weights_gib']:>9.2f}   {own_copy}")
        lines.append(f"  {'KV cache of the rollout batch':<36} {mem['kv_cache_gib']:>9.2f}   "
                     f"({mem['rollout_batch']} rows x {mem['kv_per_sequence_mib']:.0f} MiB per full-length rollout)")
        lines.append(f"  {'rollout total':<36} {mem['rollout_total_gib']:>9.2f}   {r['fits']['rollout']}")
    lines.append(f"  {'RL trainer (one packed micro-batch)':<36} {r['fits']['rl_train_gib']:>9.2f}   "
                 f"{r['fits']['rl_train']}")
    if r["sampler"] == "vllm-engine":  # a vLLM server (or the lab's decoder) leaves the trainer's card alone
        lines.append(f"  {'RL, trainer + in-process vLLM':<36} {r['fits']['together_gib']:>9.2f}   "
                     f"{r['fits']['rl_together']}; vLLM's share from this plan: {r['fits']['vllm_memory_fraction']}")
    lines += [f"  fits: estimate x {r['fits']['margin']} <= {memory:g} GiB (plan() ran up to 22% under the",
              "  measured H100/H200 peaks); tight: only the estimate itself fits", "", "time per step (estimates)"]
    tokens_per_gpu = t["sft_tokens_per_step"] // r["gpus"]
    lines += [
        f"  {'SFT optimizer step':<36} {_seconds(t['sft_seconds']):>9}   {tokens_per_gpu:,} tokens per GPU, "
        f"{t['sft_tokens_per_s']:,.0f} tokens/s over all GPUs",
        f"  {'RL rollouts':<36} {_seconds(t['rl_rollout_seconds']):>9}   {t['rl_rollouts']} rollouts of "
        f"~{a['prompt_tokens']} + {t['rl_response_tokens']:.0f} tokens, {t['rl_rollout_bound']}-bound",
        f"  {'RL update':<36} {_seconds(t['rl_update_seconds']):>9}   {t['rl_update_tokens']:,.0f} tokens",
        f"  {'RL step':<36} {_seconds(t['rl_step_seconds']):>9}   {_seconds(t['rl_run_hours'] * 3600)} for the "
        f"preset's {t['rl_steps']} RL steps",
        f"  {'SFT run':<36} {_seconds(t['sft_run_hours'] * 3600):>9}   {t['sft_epochs']:g} epoch(s) over <= "
        f"{t['sft_examples']:,} trajectories of ~{t['sft_example_tokens']:,.0f} tokens",
        f"  {'RL pool screening':<36} {_seconds(t['pool_screen_hours'] * 3600):>9}   "
        f"{t['pool_candidates']:,} candidates x {t['pool_samples']} samples",
        f"  {'SFT + screening + RL':<36} {_seconds(t['total_hours'] * 3600):>9}   the training",
        _alone_line(r),
        f"  {'capture (the teacher)':<36} "
        + (f"{_seconds(t['capture_hours'] * 3600):>9}   the local teacher's agent calls" if t["capture_hours"] is not None
           else f"{'-':>9}   a remote teacher (capture.teacher_url): the endpoint's time"),
        *([f"  {'':<36} {'':>9}   {t['teacher']}: {t['teacher_weights_gib']:.1f} GiB of bf16 weights, "
           + ("fits" if t["teacher_weights_gib"] * r["fits"]["margin"] <= memory else "does NOT fit")
           + f" {memory:g} GiB at the x{r['fits']['margin']} margin (the rest holds its KV cache)"] if t.get("teacher") else []),
        f"  {'evaluation':<36} {_seconds(t['eval_hours'] * 3600):>9}   base, SFT, RL on test + validation; the teacher",
        f"  {'the whole recipe':<36} {_seconds(t['afternoon_hours'] * 3600):>9}   capture + training + evaluation",
        *([f"  (RL trains {r['rl_model']}: the 'RL trainer' row prices that, docs/scaling.md)"]
          if r.get("rl_model") else
          ["  (RL refuses full-parameter training with vLLM sampling today, docs/scaling.md: the RL rows only price it)"]
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
    problems = r.get("recipe_problems") or []
    lines += ["", "the recipe's data: " + ("every stage's draw is full and disjoint" if not problems else
                                          "CANNOT RUN as written"), *(f"  - {p}" for p in problems)]
    return "\n".join(lines)
