"""Benchmark the DAPO policy update: one packed row per group (coa_lab/training/packing.py: the group's
shared prompt computed once, no padding) vs padded rows, on the same sampled groups, in one run.

Run:  python -m benchmarks.bench_rl_update [--groups 6] [--adapter DIR]
Writes runs/bench/rl_update.json (under COA_LAB_RUNS if set).

The groups are sampled once (held-out arithmetic tasks, the demo's SFT adapter when
runs/demo/sft/adapter exists, the RL temperature and group size of the preset), then
`rl.update.policy_update` runs on them from the same weights and a fresh optimizer, packed
and padded, alternating (`--repeats`, best of each). Printed: seconds of each, token positions each computes (the old-log-prob
pass and the trained forward), the speed-up, the loss of each (equal up to float noise),
and the machine's measured matmul peaks.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path


from benchmarks.results import demo_adapter, save  # noqa: E402

from coa_lab.student_rollout import run_coa  # noqa: E402
from coa_lab.config import get_preset  # noqa: E402
from coa_lab.generation.hf_generator import HFGenerator  # noqa: E402
from coa_lab.generation.models import compute_context, load_model  # noqa: E402
from coa_lab.pipeline import draw_tasks, make_tools  # noqa: E402
from coa_lab.machine import machine_peak  # noqa: E402
from coa_lab.rl.rollouts import score_rollouts  # noqa: E402
from coa_lab.rl.update import policy_update  # noqa: E402


def sampled_groups(preset, model, tok, n: int) -> tuple[list, list]:
    """(groups, shaped rewards): `n` held-out arithmetic questions, rl.group_size rollouts each, sampled at
    the RL temperature by `model` and scored as RL scores them."""
    rl, compute = preset.rl, (lambda: compute_context(model, preset.model))
    tasks = draw_tasks(preset, {"math/arith": n}, "eval")
    rollouts = run_coa(HFGenerator(model, tok, preset.gen.batch_size, compute=compute), tasks, make_tools(preset),
                       preset.gen, samples=rl.group_size, temperature=rl.temperature)
    _, shaped = score_rollouts(rollouts, preset.gen.max_response_tokens, rl.overlong_buffer)
    groups = [rollouts[i:i + rl.group_size] for i in range(0, len(rollouts), rl.group_size)]
    return groups, [shaped[i:i + rl.group_size] for i in range(0, len(shaped), rl.group_size)]


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=6)
    ap.add_argument("--adapter", type=Path, default=None)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--preset", default="cpu-tiny")
    args = ap.parse_args()
    preset = get_preset(args.preset)
    adapter = demo_adapter(args.adapter)
    torch.manual_seed(preset.seed)
    random.seed(preset.seed)
    model, tok = load_model(preset.model, adapter=adapter, trainable=True)
    compute = lambda: compute_context(model, preset.model)  # noqa: E731
    rl = preset.rl
    groups, rewards = sampled_groups(preset, model, tok, args.groups)
    rollouts = [r for g in groups for r in g]
    real = sum(len(r.prompt_ids) + len(r.response_ids) for r in rollouts)
    shared = sum(len(g[0].prompt_ids) + sum(len(r.response_ids) for r in g) for g in groups)  # upper bound of packing
    width = sum(max(len(r.prompt_ids) + len(r.response_ids) for r in g) * len(g) for g in groups)
    print(f"model {preset.model.name}" + (f" + adapter {adapter}" if adapter else "") +
          f"; {len(groups)} groups of {rl.group_size} rollouts, {real} real tokens "
          f"({shared} with each group's prompt once; {width} padded per group)")

    start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    arms = {}
    # alternating, best of `repeats` each: this machine's speed drifts within minutes
    for name, packed in [("packed", True), ("padded", False)] * args.repeats:
        with torch.no_grad():  # the same weights and a fresh optimizer for both arms
            for n, p in model.named_parameters():
                if n in start:
                    p.copy_(start[n])
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=rl.learning_rate, weight_decay=0.0)
        random.seed(preset.seed)  # the same mini-batch order
        t0 = time.perf_counter()
        stats = policy_update(model, opt, groups, rewards, preset, tok.pad_token_id, compute, packed=packed)
        seconds = round(time.perf_counter() - t0, 1)
        print(f"  {name}: {seconds:6.1f} s  loss {stats['loss']:+.5f}  ratio {stats['ratio_mean']:.5f}")
        if name not in arms or seconds < arms[name]["seconds"]:
            arms[name] = {"seconds": seconds, "loss": stats["loss"], "ratio_mean": stats["ratio_mean"],
                          "train_tokens": stats["train_tokens"]}
    result = {"groups": len(groups), "group_size": rl.group_size, "mini_batches": rl.mini_batches,
              "adapter": str(adapter) if adapter else None, "real_tokens": real,
              "tokens_with_prompt_once": shared, "padded_tokens": width, **arms,
              "speedup": round(arms["padded"]["seconds"] / arms["packed"]["seconds"], 2),
              "machine": machine_peak(preset)}
    print(f"speed-up of the packed update: {result['speedup']}x")
    save("rl_update", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
