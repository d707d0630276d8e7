"""Is an RL adapter's loss against SFT its update's direction, or just the size of the step?

Run:  python -m benchmarks.probe_rl_drift --rl RUN/rl/adapter [--rl ...]
      [--sft-adapter runs/bench/rl_seeds/sft/adapter] [--split val] [--arith 96 --lookup 32]
Writes runs/bench/NAME.json (--name, default rl_drift; under COA_LAB_RUNS if set). A diagnostic, not part of `make bench`.

For each RL adapter it builds a control: the SFT adapter plus Gaussian noise scaled, tensor by
tensor, to the norm of that RL adapter's change (the same step size, in a random direction).
SFT, every RL adapter and every control are scored greedily on the same validation tasks, per
family (accuracy and format validity) and per question template (rl.pool.template_of), with
each RL adapter's tasks lost and gained against SFT per template: RL's LoRA is shared by every
template, and a phrase rewarded on one spreads to others (docs/history.md, "Why RL fell, part 2"). A control that scores like SFT while the RL adapter does
not says the loss is in the direction RL took, not in moving at all (docs/history.md, "Why RL
fell": the controls scored exactly SFT's figures; RL lost look-up format validity).
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path


from benchmarks.results import save  # noqa: E402

from coa_lab import pipeline  # noqa: E402
from coa_lab.machine import machine_peak  # noqa: E402
from coa_lab.config import get_preset  # noqa: E402
from coa_lab.evaluate import evaluate  # noqa: E402
from coa_lab.generation.llm import make_generator  # noqa: E402
from coa_lab.paths import runs_dir  # noqa: E402
from coa_lab.rl.pool import template_of  # noqa: E402

WEIGHTS = "adapter_model.safetensors"


def same_norm_noise(sft: Path, rl: Path, out: Path, seed: int) -> Path:
    """SFT + noise whose norm, per tensor, is that of (RL - SFT): written as an adapter folder."""
    import torch
    from safetensors.torch import load_file, save_file

    a, b = load_file(str(sft / WEIGHTS)), load_file(str(rl / WEIGHTS))
    g = torch.Generator().manual_seed(seed)
    noisy = {}
    for k, w in a.items():
        n = torch.randn(w.shape, generator=g)
        noisy[k] = w + n * ((b[k] - w).norm() / n.norm())
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(sft, out)
    save_file(noisy, str(out / WEIGHTS))
    return out


def by_template(scores: dict[str, float], template: dict[str, str]) -> dict[str, list]:
    """template -> [accuracy, tasks]: drift shows per kind of question (rl.pool.template_of)."""
    out: dict[str, list] = {}
    for task, s in scores.items():
        out.setdefault(template[task], []).append(s)
    return {k: [round(sum(v) / len(v), 3), len(v)] for k, v in sorted(out.items())}


def flips(before: dict[str, float], after: dict[str, float], template: dict[str, str]) -> dict[str, list[int]]:
    """template -> [tasks right before and wrong after, wrong before and right after]."""
    out: dict[str, list[int]] = {}
    for task, s in after.items():
        lost, gained = before[task] == 1.0 and s < 1.0, before[task] < 1.0 and s == 1.0
        if lost or gained:
            row = out.setdefault(template[task], [0, 0])
            row[0 if lost else 1] += 1
    return dict(sorted(out.items()))


def sft_set_by_template(kept: Path) -> dict[str, int]:
    """template -> trajectories of that kind in the SFT set (distill/kept.jsonl of a run)."""
    from coa_lab.tasks.suites import load_suite
    from coa_lab.trajectories import load_records

    train = {t.id: t for suite, bench in (("math", "arith"), ("mhqa", "lookup"))
             for t in load_suite(suite, "train", benchmark=bench)}
    out: dict[str, int] = {}
    for r in load_records(kept):
        task = train.get(r.task_id)
        key = template_of(task) if task is not None else r.source
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rl", type=Path, action="append", required=True, help="an RL adapter folder (repeatable)")
    ap.add_argument("--sft-adapter", type=Path, default=runs_dir() / "bench" / "rl_seeds" / "sft" / "adapter")
    ap.add_argument("--split", choices=["val", "test"], default="val")
    ap.add_argument("--arith", type=int, default=96)
    ap.add_argument("--lookup", type=int, default=32)
    ap.add_argument("--no-noise", action="store_true", help="skip the same-norm noise controls")
    ap.add_argument("--name", default="rl_drift", help="result name under runs/bench/")
    args = ap.parse_args()
    preset = get_preset("cpu-tiny")
    mix = {k: n for k, n in {"math/arith": args.arith, "mhqa/lookup": args.lookup}.items() if n > 0}
    groups = pipeline.by_benchmark(pipeline.draw_tasks(preset, mix, args.split), mix)
    tools = pipeline.make_tools(preset)
    work = runs_dir() / "bench" / "rl_drift"
    arms = {"sft": args.sft_adapter}
    for i, rl in enumerate(args.rl):
        arms[f"rl_{i}"] = rl
        if not args.no_noise:
            arms[f"noise_{i}"] = same_norm_noise(args.sft_adapter, rl, work / f"noise_{i}", seed=i + 1)
    out = {"split": args.split, "mix": mix, "sft_adapter": str(args.sft_adapter),
           "rl_adapters": [str(p) for p in args.rl], "arms": {}, "machine": machine_peak(preset)}
    template = {t.id: template_of(t) for ts in groups.values() for t in ts}
    # what SFT was taught, per template: a kind of question with no trajectory in the SFT set
    # starts RL near 0, and screening (rl.pool_min_pass) then keeps none of it for RL to learn
    kept = args.sft_adapter.resolve().parent.parent / "distill" / "kept.jsonl"
    if kept.exists():
        out["sft_set_by_template"] = sft_set_by_template(kept)
    scores: dict[str, dict[str, float]] = {}
    for name, adapter in arms.items():
        t0 = time.time()
        result = evaluate(make_generator(preset, adapter), groups, tools, preset, label=name)
        out["arms"][name] = {k: {"accuracy": s.accuracy, "format_valid": s.format_valid} for k, s in result.suites.items()}
        out["arms"][name]["seconds"] = round(time.time() - t0, 1)
        scores[name] = {r.task_id: r.reward for r in result.records}
        out["arms"][name]["by_template"] = by_template(scores[name], template)
        if name != "sft":  # per template: SFT-solved tasks this arm lost, SFT-failed ones it gained
            out["arms"][name]["lost_gained_vs_sft"] = flips(scores["sft"], scores[name], template)
        print(name, out["arms"][name], flush=True)
    save(args.name, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
