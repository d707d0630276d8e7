"""Is an RL adapter's loss against SFT its update's direction, or just the size of the step?

Run:  PYTHONPATH=. python benchmarks/probe_rl_drift.py --rl RUN/rl/adapter [--rl ...]
      [--sft-adapter runs/bench/rl_seeds/sft/adapter] [--split val] [--arith 96 --lookup 32]
Writes runs/bench/rl_drift.json (under COA_LAB_RUNS if set). A diagnostic, not part of `make bench`.

For each RL adapter it builds a control: the SFT adapter plus Gaussian noise scaled, tensor by
tensor, to the norm of that RL adapter's change (the same step size, in a random direction).
SFT, every RL adapter and every control are scored greedily on the same validation tasks, per
family (accuracy and format validity). A control that scores like SFT while the RL adapter does
not says the loss is in the direction RL took, not in moving at all (docs/design.md, "Why RL
fell": the controls scored exactly SFT's figures; RL lost look-up format validity).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from results import save  # noqa: E402 - benchmarks/results.py, beside this script

from coa_lab import pipeline  # noqa: E402
from coa_lab.config import get_preset  # noqa: E402
from coa_lab.evaluate import evaluate  # noqa: E402
from coa_lab.generation.llm import make_generator  # noqa: E402
from coa_lab.paths import runs_dir  # noqa: E402

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rl", type=Path, action="append", required=True, help="an RL adapter folder (repeatable)")
    ap.add_argument("--sft-adapter", type=Path, default=runs_dir() / "bench" / "rl_seeds" / "sft" / "adapter")
    ap.add_argument("--split", choices=["val", "test"], default="val")
    ap.add_argument("--arith", type=int, default=96)
    ap.add_argument("--lookup", type=int, default=32)
    args = ap.parse_args()
    preset = get_preset("cpu-tiny")
    mix = {"math/arith": args.arith, "mhqa/lookup": args.lookup}
    groups = pipeline.by_benchmark(pipeline.draw_tasks(preset, mix, args.split), mix)
    tools = pipeline.make_tools(preset)
    work = runs_dir() / "bench" / "rl_drift"
    arms = {"sft": args.sft_adapter}
    for i, rl in enumerate(args.rl):
        arms[f"rl_{i}"] = rl
        arms[f"noise_{i}"] = same_norm_noise(args.sft_adapter, rl, work / f"noise_{i}", seed=i + 1)
    out = {"split": args.split, "mix": mix, "rl_adapters": [str(p) for p in args.rl], "arms": {},
           "machine": pipeline.machine_peak(preset)}
    for name, adapter in arms.items():
        t0 = time.time()
        result = evaluate(make_generator(preset, adapter), groups, tools, preset, label=name)
        out["arms"][name] = {k: {"accuracy": s.accuracy, "format_valid": s.format_valid} for k, s in result.suites.items()}
        out["arms"][name]["seconds"] = round(time.time() - t0, 1)
        print(name, out["arms"][name], flush=True)
    save("rl_drift", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
