"""Does RL reliably improve the SFT policy? The RL stage with several seeds from ONE SFT adapter,
each RL adapter evaluated on the TEST split (never tuned on), the spread reported, not one run.

Run:  python -m benchmarks.bench_rl_seeds [--seeds 0 1 2 3 4] [--sft-adapter DIR]
      [--set rl.steps=8 ...]
Writes runs/bench/rl_seeds.json and rl_seeds.png (under COA_LAB_RUNS if set), rewritten after
every seed, so an interrupted benchmark keeps the seeds it finished.

1. The SFT adapter: `--sft-adapter`, else the one this benchmark trained before
   (runs/bench/rl_seeds/sft/adapter), else it is trained now exactly as the demo does, from the
   shipped teacher capture (datasets/teacher_runs/: distill, then masked SFT).
2. The SFT policy on the test split's learnable tasks (the demo's `eval.tasks`, headline
   benchmarks only: 144 arithmetic + 48 look-ups), greedy.
3. Per seed: the demo's RL stage (`pipeline.rl`: pool screening by pass rate, anchors, DAPO) with
   `rl.seed` = that seed, then the RL adapter on the same test tasks. The pool is screened once,
   by the first seed, and reused by the others (`--screen-per-seed` screens each): what varies is
   RL's own randomness (rollout samples, task order, anchors), and each seed costs its 8 steps
   and its eval rather than also 256 screening rollouts (~12 min on 2 cores).
   `--append` continues an interrupted benchmark: the SFT figures, the seeds and the pool
   screening already in runs/bench/rl_seeds.json are kept (the same adapter weights, checked by
   their sha256, preset and overrides required). To go on from the committed result, copy
   docs/results/rl_seeds.json there first: SFT from the shipped capture is deterministic on one
   machine, so the adapter is trained again with the same weights. The numeric mode must match
   too (`bf16_autocast`, recorded: pin it with COA_LAB_CPU_BF16=0 or 1 in both sessions).
Tuning reads the VALIDATION split, never test: `--split val --name tune_<what> --set rl.X=Y`
scores the SFT policy and each seed on `eval.val_tasks` (48 + 16), and `--pool-from` trains on
an earlier run's screening (rl/pool.json), so a setting is compared on the same pool.

The targets, computed and printed: RL >= SFT in every seed, mean gain >= +5 points, no
seed's format validity below SFT's - 2 points, last-third training accuracy >= first third in
at least 4 of 5 seeds. Hours on a 2-core CPU (each seed is a whole RL stage and a 192-task eval).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path


from benchmarks import rl_arms  # noqa: E402 - the arms of --arms
from benchmarks.results import save  # noqa: E402

from coa_lab import pipeline  # noqa: E402
from coa_lab.machine import machine_peak  # noqa: E402
from coa_lab.config import get_preset  # noqa: E402
from coa_lab.evaluate import evaluate  # noqa: E402
from coa_lab.generation.llm import make_generator  # noqa: E402
from coa_lab.lessons.inputs import SHIPPED_TEACHER_RUNS  # noqa: E402
from coa_lab.paths import runs_dir  # noqa: E402


def pooled(result, keys) -> dict:
    """Accuracy and format validity over the headline benchmarks, weighted by their tasks."""
    suites = [result.suites[k] for k in keys if k in result.suites]
    n = sum(s.tasks * s.samples for s in suites)
    return {"tasks": sum(s.tasks for s in suites),
            "accuracy": sum(s.accuracy * s.tasks * s.samples for s in suites) / n,
            "format_valid": sum(s.format_valid * s.tasks * s.samples for s in suites) / n,
            # per benchmark: where a gain is (RL took arithmetic to its ceiling and left the
            # look-ups where SFT had them: docs/design.md, "Where RL's gain is")
            "by_benchmark": {k: result.suites[k].accuracy for k in keys if k in result.suites}}


def thirds(xs: list[float]) -> tuple[float, float] | None:
    k = len(xs) // 3
    return (sum(xs[:k]) / k, sum(xs[-k:]) / k) if k else None


def targets(out: dict) -> dict:
    gains, thirds_up = out["gains"], [t[1] >= t[0] for t in map(thirds, out["train_accuracy_by_step"]) if t]
    n = len(gains)
    return {
        "seeds_done": n,
        # a tie is a tie: neither above nor below SFT
        "rl_above_sft": sum(g > 0 for g in gains),
        "rl_ties_sft": sum(g == 0 for g in gains),
        "mean_gain_points": round(100 * sum(gains) / n, 2) if n else None,
        "worst_format_drop_points": round(100 * (out["sft_format_valid"] - min(out["rl_format_valid"])), 2) if n else None,
        "last_third_ge_first_third": sum(thirds_up),
        "met": bool(n >= 5 and all(g >= 0 for g in gains) and sum(gains) / n >= 0.05
                    and min(out["rl_format_valid"]) >= out["sft_format_valid"] - 0.02 and sum(thirds_up) >= 4),
    }


def plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for seed, curve in zip(out["seeds"], out["train_accuracy_by_step"]):
        a.plot(range(len(curve)), curve, marker="o", label=f"seed {seed}")
    a.set(xlabel="RL step", ylabel="training accuracy (pool rollouts)", title="RL training curve per seed", ylim=(0, 1))
    a.legend(fontsize=8)
    gains = [100 * g for g in out["gains"]]
    b.bar([str(s) for s in out["seeds"]], gains, color=["tab:green" if g >= 0 else "tab:red" for g in gains])
    b.axhline(0, color="black", lw=0.8)
    b.axhline(5, color="gray", ls="--", lw=0.8, label="target mean +5")
    b.set(xlabel="seed", ylabel="RL − SFT, test accuracy (points)",
          title=f"gain on {out['test_tasks']} test tasks (SFT {out['sft_test_accuracy']:.2f})")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


_finished_rl = rl_arms.finished_rl  # the RL summary of a run whose stage ran all its steps, else None


def weights_sha256(adapter: Path) -> str:
    import hashlib

    return hashlib.sha256((adapter / "adapter_model.safetensors").read_bytes()).hexdigest()


def sft_adapter(preset, base: Path, explicit: Path | None) -> Path:
    if explicit is not None:
        return explicit
    adapter = base / "sft" / "adapter"
    if not (adapter / "adapter_config.json").exists():
        print("training the SFT adapter from the shipped teacher capture (distill + masked SFT) ...")
        (base / "capture").mkdir(parents=True, exist_ok=True)
        shutil.copy(SHIPPED_TEACHER_RUNS, base / "capture" / "traces.jsonl")
        pipeline.distill(preset, base)
        pipeline.sft(preset, base)
    return adapter


def sft_set(adapter: Path) -> Path:
    """The trajectories an adapter was trained on: RUN/distill/kept.jsonl beside RUN/sft/adapter."""
    return adapter.resolve().parent.parent / "distill" / "kept.jsonl"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--preset", default="cpu-tiny")
    ap.add_argument("--sft-adapter", type=Path, default=None)
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    ap.add_argument("--name", default=None, help="result name under runs/bench/ (default rl_seeds, or rl_arms "
                    "with --arms)")
    ap.add_argument("--arms", nargs="+", default=None, metavar="ARM",
                    help="control, rl, rl+ptx: each from the one SFT adapter, same seeds, pool and tasks "
                         "(benchmarks/rl_arms.py)")
    ap.add_argument("--final", action="store_true", help="allow reading the confirmation split (recorded)")
    ap.add_argument("--screen-per-seed", action="store_true", help="screen the RL pool again for every seed")
    ap.add_argument("--append", action="store_true", help="keep the SFT eval and seeds of an earlier run")
    ap.add_argument("--split", choices=["test", "selection", "val", "confirm"], default="test",
                    help="val: a TUNING run, scored on eval.val_tasks; test (= selection): the 192 tasks earlier "
                         "benchmarks read; confirm: the confirmation split, --arms --final only")
    ap.add_argument("--pool-from", type=Path, default=None,
                    help="an earlier run's rl/pool.json: every seed trains on that screening")
    return ap


def main(argv: list[str] | None = None) -> int:
    from coa_lab.cli import parse_overrides

    args = _parser().parse_args(argv)
    args.name = args.name or ("rl_arms" if args.arms else "rl_seeds")
    if args.split == "confirm" and not args.arms:
        raise SystemExit("the confirmation split is read by --arms --final only")
    overrides = parse_overrides(args.set)
    preset = get_preset(args.preset, **overrides)
    base = runs_dir() / "bench" / args.name
    adapter = sft_adapter(preset, base, args.sft_adapter)
    kept = sft_set(adapter)
    # each arm names its own SFT mix; without --arms the preset's mix decides
    mixes = rl_arms.sft_mixing(args.arms) if args.arms else preset.rl.sft_coef > 0
    if mixes and not kept.exists():  # found out now, not after the pool screening
        raise SystemExit(f"{kept} is missing: an SFT mix (rl.sft_coef > 0; arms control and rl+ptx) reads the "
                         f"adapter's SFT trajectories from beside it (RUN/sft/adapter -> RUN/distill); give the "
                         f"adapter of a run folder, or --set rl.sft_coef=0 / --arms rl")
    if args.arms:
        return rl_arms.run_arms(args, overrides, base, adapter, kept)
    keys = list(preset.eval.headline)
    mix = {k: n for k, n in (preset.eval.tasks if args.split == "test" else preset.eval.val_tasks).items() if k in keys}
    groups = pipeline.by_benchmark(pipeline.draw_tasks(preset, mix, "val" if args.split == "val" else "test"), mix)
    tools = pipeline.make_tools(preset)
    t0 = time.time()
    out, sft = _start_record(args, preset, adapter, mix, groups, tools, keys)
    print(f"SFT on {sft['tasks']} {args.split} tasks: accuracy {sft['accuracy']:.3f}, "
          f"format valid {sft['format_valid']:.3f}")
    for seed in args.seeds:
        if seed in out["seeds"]:
            continue
        seeded = get_preset(args.preset, **{**overrides, "rl": {**overrides.get("rl", {}), "seed": seed}})
        summary, rl_seconds = _train_seed(args, seeded, base, out, adapter, kept, seed)
        t1 = time.time()
        rl = pooled(evaluate(make_generator(seeded, base / f"seed{seed}" / "rl" / "adapter"), groups, tools, seeded,
                             label="rl"), keys)
        _record_seed(out, sft, seed, rl, summary["metrics"], base / f"seed{seed}", rl_seconds,
                     round(time.time() - t1, 1))
        out["machine"] = machine_peak(preset)
        out["seconds"] = round(time.time() - t0, 1)
        path = save(args.name, out)
        plot(out, path.with_suffix(".png"))
    print(json.dumps(out["targets"], indent=2))
    return 0


def _start_record(args, preset, adapter: Path, mix: dict, groups, tools, keys) -> tuple[dict, dict]:
    """The result record and the SFT policy's score: kept from an earlier run (--append), else read now."""
    machine_start = machine_peak(preset)
    # bf16 autocast is decided per process by timing a matmul (generation/models.cpu_bf16_is_fast):
    # greedy decoding under bf16 and fp32 differ on a few tasks, so SFT and every seed must be
    # scored in one mode (pin it with COA_LAB_CPU_BF16=0/1 across sessions)
    autocast = machine_start["bf16_autocast"]
    earlier = runs_dir() / "bench" / f"{args.name}.json"
    if args.append and earlier.exists():
        out = json.loads(earlier.read_text())
        # the adapter by its weights, not its path: SFT from the shipped capture is deterministic on
        # one machine, so another session (or a copy of docs/results/rl_seeds.json) can go on
        same = {"sft_adapter_sha256": weights_sha256(adapter), "test_mix": mix, "overrides": args.set,
                "preset": args.preset, "bf16_autocast": autocast}
        if any(out.get(k) != v for k, v in same.items()):
            raise SystemExit(f"--append: {earlier} was run with other settings "
                             f"({ {k: out.get(k) for k in same} }); run without --append or with the same ones")
        sft = {"tasks": out["test_tasks"], "accuracy": out["sft_test_accuracy"],
               "format_valid": out["sft_format_valid"]}
        print(f"--append: keeping SFT and seeds {out['seeds']} from {earlier}")
    else:
        t0 = time.time()
        sft = pooled(evaluate(make_generator(preset, adapter), groups, tools, preset, label="sft"), keys)
        out = {"preset": args.preset, "overrides": args.set, "sft_adapter": str(adapter),
               "sft_adapter_sha256": weights_sha256(adapter), "split": args.split,
               "test_mix": mix,
               "test_tasks": sft["tasks"], "sft_test_accuracy": sft["accuracy"],
               "sft_format_valid": sft["format_valid"],
               "sft_accuracy_by_benchmark": sft["by_benchmark"], "rl_accuracy_by_benchmark": [],
               "sft_eval_seconds": round(time.time() - t0, 1), "seeds": [], "rl_test_accuracy": [],
               "rl_format_valid": [], "gains": [], "train_accuracy_by_step": [], "entropy_by_step": [],
               "logprob_gap_by_step": [], "rl_seconds": [], "eval_seconds": [], "machine_start": machine_start,
               "bf16_autocast": autocast}
    out["shared_pool"] = not args.screen_per_seed
    return out, sft


def _train_seed(args, seeded, base: Path, out: dict, adapter: Path, kept: Path, seed: int) -> tuple[dict, float]:
    """One seed's RL stage from the SFT adapter (its summary and seconds), or the finished one --append finds."""
    run = base / f"seed{seed}"
    finished = _finished_rl(run, seeded) if args.append else None
    if finished is not None:  # interrupted between its RL stage and its eval: score the adapter it left
        print(f"--append: seed {seed}'s RL stage had finished ({run / 'rl'}); evaluating its adapter")
        return finished, finished["seconds"]
    shutil.rmtree(run, ignore_errors=True)
    (run / "sft").mkdir(parents=True)
    (run / "sft" / "adapter").symlink_to(adapter.resolve())
    if kept.exists():  # the SFT set: rl.sft_coef mixes it in
        (run / "distill").symlink_to(kept.parent)
    screened = base / f"seed{out['seeds'][0]}" / "rl" / "pool.json" if out["seeds"] else args.pool_from
    if out.get("pool") and not (screened and screened.exists()):  # --append elsewhere: the kept screening
        screened = base / "pool.json"
        screened.write_text(json.dumps(out["pool"], indent=2))
    reuse = not args.screen_per_seed and screened is not None and screened.exists()
    if reuse:  # the first seed's screening (RL's randomness varies, the pool does not)
        (run / "rl").mkdir()
        shutil.copy(screened, run / "rl" / "pool.json")
    t1 = time.time()
    summary = pipeline.rl(seeded, run, reuse_pool=reuse)
    return summary, round(time.time() - t1, 1)


def _record_seed(out: dict, sft: dict, seed: int, rl: dict, metrics: list, run: Path, rl_seconds, eval_seconds) -> None:
    out["seeds"].append(seed)
    out.setdefault("pool", json.loads((run / "rl" / "pool.json").read_text()))  # what every seed trained on
    out["rl_test_accuracy"].append(rl["accuracy"])
    out["rl_format_valid"].append(rl["format_valid"])
    out.setdefault("rl_accuracy_by_benchmark", []).append(rl["by_benchmark"])  # (absent in files before it)
    out["gains"].append(rl["accuracy"] - sft["accuracy"])
    out["train_accuracy_by_step"].append([m["accuracy"] for m in metrics])
    out["entropy_by_step"].append([m.get("entropy") for m in metrics])
    out["logprob_gap_by_step"].append([m.get("logprob_gap") for m in metrics])
    out["rl_seconds"].append(rl_seconds)
    out["eval_seconds"].append(eval_seconds)
    out["targets"] = targets(out)
    print(f"seed {seed}: RL {rl['accuracy']:.3f} (gain {100 * out['gains'][-1]:+.1f} points), format valid "
          f"{rl['format_valid']:.3f}, by benchmark { {k: round(v, 3) for k, v in rl['by_benchmark'].items()} }, "
          f"train accuracy by step {[round(x, 2) for x in out['train_accuracy_by_step'][-1]]}")


if __name__ == "__main__":
    raise SystemExit(main())
