"""How far int8 rollouts move the policy (`rl.rollout_int8`): the total variation
between the next-token distributions of the fp32 model and its int8 copy (rl/int8_rollouts.py:
torch dynamic int8, fbgemm), on the chat prompts of real training questions, at the RL sampling
temperature. 0 is the same policy, 1 disjoint ones; the switch stays off while this is large.

Run:  python -m benchmarks.bench_int8_drift [--prompts 16] [--temperature 0.8]
Writes runs/bench/int8_drift.json (COA_LAB_PUBLISH=1: docs/results/int8_drift.json). Seconds.
"""

from __future__ import annotations

import argparse


from benchmarks.results import save  # noqa: E402

from coa_lab import pipeline  # noqa: E402
from coa_lab.machine import machine_peak  # noqa: E402
from coa_lab.config import get_preset  # noqa: E402


def total_variation(logits_a, logits_b, temperature: float):
    """Per row, half the L1 distance between softmax(a / T) and softmax(b / T)."""
    import torch

    p = torch.softmax(logits_a.float() / temperature, -1)
    q = torch.softmax(logits_b.float() / temperature, -1)
    return 0.5 * (p - q).abs().sum(-1)


def main(argv: list[str] | None = None) -> int:
    import torch

    from coa_lab.generation.chat_prompt import chat_prompt_ids
    from coa_lab.generation.models import load_model
    from coa_lab.prompts import task_messages
    from coa_lab.protocol import PROFILE_TOOLS
    from coa_lab.rl.int8_rollouts import int8_copy

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16, help="training questions (half arithmetic, half look-ups)")
    ap.add_argument("--temperature", type=float, default=None, help="default: the preset's rl.temperature")
    args = ap.parse_args(argv)
    preset = get_preset("cpu-tiny")
    temperature = args.temperature or preset.rl.temperature
    half = max(1, args.prompts // 2)
    tasks = pipeline.draw_tasks(preset, {"math/arith": half, "mhqa/lookup": args.prompts - half}, "train")
    model, tokenizer = load_model(preset.model, trainable=False)
    model.eval()
    twin = int8_copy(model)
    tvs = []
    with torch.no_grad():
        for task in tasks:
            ids = chat_prompt_ids(tokenizer, task_messages(task.profile, task.question, PROFILE_TOOLS[task.profile]))
            x = torch.tensor([ids])
            tvs.append(float(total_variation(model(x).logits[0, -1:], twin(x).logits[0, -1:], temperature)[0]))
    out = {"prompts": len(tvs), "temperature": temperature, "tv_mean": sum(tvs) / len(tvs), "tv_min": min(tvs),
           "tv_max": max(tvs), "tv_by_prompt": tvs, "machine": machine_peak(preset)}
    print(f"total variation fp32 vs int8 at T={temperature}: mean {out['tv_mean']:.3f} "
          f"(min {out['tv_min']:.3f}, max {out['tv_max']:.3f}) over {len(tvs)} prompts")
    save("int8_drift", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
