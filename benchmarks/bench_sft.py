"""Benchmark masked SFT: the lab's loss (LM head only from the first labelled position) vs
transformers' own causal-LM loss, on the same shipped trajectories, in one run.

Run:  PYTHONPATH=. python benchmarks/bench_sft.py [--examples 24] [--steps 12]
Writes runs/bench/sft.json (under COA_LAB_RUNS if set).

Both arms use transformers' Trainer with the same LoRA model, data order, batch and
collator (right padding, -100 labels on prompt and observation tokens), so the difference
is the loss alone. Printed: seconds, tokens/s (real tokens fed, padding excluded), achieved
FLOP/s and its fraction of the machine's measured matmul peak -- FLOPs counted as
4 x parameters per token fed (forward + the input gradient of the backward; LoRA's own weight
gradients are under 1% of that), attention ignored -- and the padding overhead of the batches.
The demo's SFT runs the lab's arm; whatever fraction of the peak it reaches is what bounds
its minutes on a CPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from results import save  # noqa: E402 - benchmarks/results.py, beside this script

from coa_lab.config import get_preset  # noqa: E402
from coa_lab.distill.importers import load_imported  # noqa: E402
from coa_lab.models import load_model  # noqa: E402
from coa_lab.paths import DATASETS_DIR, runs_dir  # noqa: E402
from coa_lab.pipeline import machine_peak  # noqa: E402
from coa_lab.sft import masked_trainer, encode_example, pad_batch, record_messages  # noqa: E402


def train(preset, rows, steps: int, masked: bool, out: Path) -> float:
    """Seconds of `steps` optimizer steps of batch `preset.sft.batch_size` (model load excluded)."""
    import torch
    from transformers import Trainer, TrainingArguments

    from coa_lab.models import cpu_autocast_enabled

    torch.manual_seed(preset.seed)
    model, tokenizer = load_model(preset.model, trainable=True)
    cuda = torch.cuda.is_available()
    args = TrainingArguments(bf16=(cuda and preset.model.dtype == "bfloat16") or (not cuda and cpu_autocast_enabled(preset.model)),
                             output_dir=str(out), max_steps=steps, per_device_train_batch_size=preset.sft.batch_size,
                             learning_rate=preset.sft.learning_rate, logging_steps=steps, save_strategy="no",
                             report_to="none", remove_unused_columns=False, use_cpu=not cuda,
                             seed=preset.seed, dataloader_num_workers=0, disable_tqdm=True)
    cls = masked_trainer() if masked else Trainer
    trainer = cls(model=model, args=args, train_dataset=rows,
                  data_collator=lambda batch: pad_batch(batch, tokenizer.pad_token_id))
    t0 = time.perf_counter()
    trainer.train()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=24)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--preset", default="cpu-tiny")
    args = ap.parse_args()
    preset = get_preset(args.preset)
    records = [t.to_record() for t in load_imported(DATASETS_DIR / "trajectories" / "tora70b_gsm8k.jsonl")]
    records += [t.to_record() for t in load_imported(DATASETS_DIR / "trajectories" / "fireact_hotpotqa_react.jsonl")]
    records = records[: args.examples]
    model, tokenizer = load_model(preset.model)
    n_params = sum(p.numel() for p in model.parameters())
    rows = [encode_example(tokenizer, record_messages(r), r.text, preset.sft.max_length) for r in records]
    for r in rows:
        r.pop("n_observation_tokens")
    batch = preset.sft.batch_size
    per_step = [rows[i % len(rows)] for i in range(args.steps * batch)]  # what the Trainer feeds (seeded order aside)
    tokens = sum(len(r["input_ids"]) for r in per_step)
    padded = sum(max(len(r["input_ids"]) for r in per_step[i:i + batch]) * batch for i in range(0, len(per_step), batch))
    print(f"{len(rows)} shipped trajectories (ToRA GSM8K + FireAct HotpotQA), {args.steps} steps of {batch}, "
          f"~{tokens // args.steps} tokens per step")
    runs = runs_dir() / "bench" / "sft"
    lab_s = train(preset, rows, args.steps, True, runs / "lab")
    base_s = train(preset, rows, args.steps, False, runs / "plain")
    peak = machine_peak(preset)
    dtype_peak = peak["bf16_gflops"] if peak["bf16_autocast"] else peak["fp32_gflops"]

    def arm(seconds: float) -> dict:
        gflops = 4 * n_params * tokens / seconds / 1e9
        return {"seconds": round(seconds, 1), "tokens_per_s": round(tokens / seconds, 1),
                "achieved_gflops": round(gflops, 1), "fraction_of_peak": round(gflops / dtype_peak, 2)}

    result = {"examples": len(rows), "steps": args.steps, "batch": batch, "tokens": tokens,
              "padding_overhead": round(padded / tokens, 3), "params": n_params,
              "lab_masked_loss": arm(lab_s), "plain_trainer": arm(base_s),
              "speedup": round(base_s / lab_s, 2), "peak_used_gflops": dtype_peak, "machine": peak}
    print(f"  lab (masked loss)  : {lab_s:6.1f} s  {result['lab_masked_loss']['tokens_per_s']:6.1f} tok/s  "
          f"{result['lab_masked_loss']['achieved_gflops']} GFLOP/s = {result['lab_masked_loss']['fraction_of_peak']:.0%} of peak")
    print(f"  plain Trainer      : {base_s:6.1f} s  {result['plain_trainer']['tokens_per_s']:6.1f} tok/s  "
          f"{result['plain_trainer']['achieved_gflops']} GFLOP/s = {result['plain_trainer']['fraction_of_peak']:.0%} of peak")
    print(f"speed-up {result['speedup']}x (goal 1.5x); padding overhead {result['padding_overhead']}x")
    save("sft", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
