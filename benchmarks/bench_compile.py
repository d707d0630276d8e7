"""Training through compiled decoder layers against eager, in one run (training/compiled_layers.py): an SFT
step and a DAPO update.

Run:  python -m benchmarks.bench_compile [--examples 24] [--steps 12] [--rl-groups 6] [--repeats 2] [--data demo|shipped]
Writes runs/bench/compile.json (under COA_LAB_RUNS if set).

The lab's SFT step (packed batches of `sft.batch_size` examples, the masked loss, AdamW at the SFT rate) under
the preset's compute context (bf16 autocast on a CPU with bf16 units), `--steps` steps an arm. Both arms
start from the same LoRA initialisation and optimizer state and see the same batches; they alternate,
`--repeats` times, each arm's best run kept (a shared machine only ever adds time):
  - `eager_s_per_step`, `compiled_s_per_step`, `speedup` (eager / compiled), tokens/s of each;
  - `compile_seconds`: the compiled arm's first step less a compiled step (what a run pays once);
  - `loss_max_rel_diff`: the largest relative difference between the two arms' losses, step by step
    (the same training, rounded differently: fused operators keep fp32 intermediates);
  - `break_even_steps`: the optimizer steps after which compiling has paid for itself;
  - where bf16 autocast is on, an fp32 eager arm too (no autocast, the same start and batches), the
    reference both bf16 arms round away from: `gap_to_fp32` of each, its losses' mean absolute distance
    from fp32's over the steps after the first update;
  - `rl_update`: `rl.update.policy_update` on `--rl-groups` groups sampled once (benchmarks/bench_rl_update.py's:
    held-out arithmetic, the demo's SFT adapter when `make demo` wrote it), both arms from the same weights,
    alternating: seconds of each (best of `--repeats`), the speed-up, and each arm's loss.
Data: the demo's kept trajectories (runs/demo/distill/kept.jsonl) when they exist, else shipped ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time

import torch

from benchmarks.bench_rl_update import sampled_groups  # noqa: E402
from benchmarks.bench_sft import training_records  # noqa: E402
from benchmarks.results import demo_adapter, save  # noqa: E402

from coa_lab.config import get_preset  # noqa: E402
from coa_lab.generation.models import compute_context, load_model  # noqa: E402
from coa_lab.machine import machine_peak  # noqa: E402
from coa_lab.training.compiled_layers import compiled_layers  # noqa: E402
from coa_lab.rl.update import policy_update  # noqa: E402
from coa_lab.training.sft import collator, encode_example, masked_lm_loss, record_messages  # noqa: E402


def train_arm(model, batches, preset, start: dict, compiled: bool) -> tuple[list[float], list[float]]:
    """(seconds of each step, loss of each step) from the state `start`, through compiled layers or not."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in start:
                p.copy_(start[name])
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=preset.sft.learning_rate)
    cfg = dataclasses.replace(preset.model, cpu_compile=compiled)
    seconds, losses = [], []
    model.train()
    with compiled_layers(model, cfg):
        for batch in batches:
            t0 = time.perf_counter()
            with compute_context(model, preset.model):
                loss = masked_lm_loss(model, batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
            seconds.append(time.perf_counter() - t0)
    return seconds, losses


def rl_update_arms(preset, n_groups: int, repeats: int) -> dict:
    """policy_update on the same sampled groups from the same weights, eager and compiled, alternating after
    one compiled run that compiles (its seconds: `first_compiled_seconds`)."""
    adapter = demo_adapter(None)
    torch.manual_seed(preset.seed)
    model, tok = load_model(preset.model, adapter=adapter, trainable=True)
    groups, rewards = sampled_groups(preset, model, tok, n_groups)
    start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    def update(compiled: bool) -> tuple[float, dict]:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in start:
                    p.copy_(start[n])
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=preset.rl.learning_rate,
                                weight_decay=0.0)
        t0 = time.perf_counter()
        with compiled_layers(model, dataclasses.replace(preset.model, cpu_compile=compiled)):
            stats = policy_update(model, opt, groups, rewards, preset, tok.pad_token_id,
                                  lambda: compute_context(model, preset.model))
        return round(time.perf_counter() - t0, 1), stats

    first, _ = update(True)
    arms: dict[str, dict] = {}
    for _ in range(max(1, repeats)):
        for name in ("eager", "compiled"):
            seconds, stats = update(name == "compiled")
            print(f"  DAPO update {name}: {seconds} s, loss {stats['loss']:+.5f}", flush=True)
            if name not in arms or seconds < arms[name]["seconds"]:
                arms[name] = {"seconds": seconds, "loss": round(stats["loss"], 6)}
    return {"groups": len(groups), "group_size": preset.rl.group_size,
            "adapter": "the demo's SFT adapter" if adapter else None, "train_tokens": stats["train_tokens"],
            "first_compiled_seconds": first, **arms,
            "speedup": round(arms["eager"]["seconds"] / arms["compiled"]["seconds"], 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=24)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rl-groups", type=int, default=6, help="groups of the DAPO update arm (0: no such arm)")
    ap.add_argument("--preset", default="cpu-tiny")
    ap.add_argument("--data", choices=["demo", "shipped"], default=None)
    args = ap.parse_args()
    preset = get_preset(args.preset, model={"cpu_compile": True})
    records, source = training_records(args.data, args.examples)
    torch.manual_seed(preset.seed)
    model, tokenizer = load_model(preset.model, trainable=True)
    rows = [encode_example(tokenizer, record_messages(r), r.text, preset.sft.max_length) for r in records]
    for r in rows:
        r.pop("n_observation_tokens")
    random.Random(preset.seed).shuffle(rows)
    build, size = collator(model, tokenizer.pad_token_id), preset.sft.batch_size
    batches = [build(rows[(i * size) % len(rows):][:size]) for i in range(args.steps)]
    tokens = sum(int(b["input_ids"].numel()) for b in batches)
    start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    machine = machine_peak(preset)
    print(f"{len(rows)} examples from {source}; {args.steps} steps of {size}, {tokens} token positions an arm")

    first = train_arm(model, batches[:1], preset, start, compiled=True)[0][0]  # compiles
    best: dict[str, float] = {}
    losses: dict[str, list[float]] = {}
    for _ in range(max(1, args.repeats)):
        for arm in ("eager", "compiled"):
            seconds, losses[arm] = train_arm(model, batches, preset, start, compiled=arm == "compiled")
            best[arm] = min(best.get(arm, float("inf")), sum(seconds))
            print(f"  {arm}: {sum(seconds) / len(seconds):.3f} s a step", flush=True)
    if machine["bf16_autocast"]:
        fp32 = dataclasses.replace(preset, model=dataclasses.replace(preset.model, cpu_autocast_bf16=False))
        losses["fp32"] = train_arm(model, batches, fp32, start, compiled=False)[1]
    per_step = {arm: best[arm] / args.steps for arm in best}
    compile_s = max(0.0, first - per_step["compiled"])
    saved = per_step["eager"] - per_step["compiled"]
    rel = max(abs(a - b) / max(abs(a), 1e-9) for a, b in zip(losses["eager"], losses["compiled"]))
    result = {"data": source, "examples": len(rows), "steps": args.steps, "batch": size, "token_positions": tokens,
              "eager_s_per_step": round(per_step["eager"], 3), "compiled_s_per_step": round(per_step["compiled"], 3),
              "speedup": round(per_step["eager"] / per_step["compiled"], 2),
              "eager_tokens_per_s": round(tokens / best["eager"], 1),
              "compiled_tokens_per_s": round(tokens / best["compiled"], 1),
              "compile_seconds": round(compile_s, 1),
              "break_even_steps": round(compile_s / saved) if saved > 0 else None,
              "loss_max_rel_diff": round(rel, 4), "losses": {k: [round(x, 4) for x in v] for k, v in losses.items()},
              "gap_to_fp32": {arm: round(sum(abs(a - b) for a, b in zip(losses[arm][1:], losses["fp32"][1:]))
                                         / max(1, len(losses["fp32"]) - 1), 4)
                              for arm in ("eager", "compiled")} if "fp32" in losses else None,
              "machine": {"start": machine}}
    if args.rl_groups:
        result["rl_update"] = rl_update_arms(preset, args.rl_groups, args.repeats)
    result["machine"]["end"] = machine_peak(preset)
    print(f"speed-up {result['speedup']}x ({result['eager_s_per_step']} -> {result['compiled_s_per_step']} s a step), "
          f"compiling {result['compile_seconds']} s (paid back after {result['break_even_steps']} steps); "
          f"losses agree within {rel:.2%}" + (f"; mean distance from fp32's losses: eager {result['gap_to_fp32']['eager']}, "
                                              f"compiled {result['gap_to_fp32']['compiled']}" if result["gap_to_fp32"] else ""))
    if args.rl_groups:
        print(f"DAPO update: speed-up {result['rl_update']['speedup']}x")
    save("compile", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
