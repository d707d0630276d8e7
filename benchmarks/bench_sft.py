"""Benchmark masked SFT: the lab's SFT (packed batches, coa_lab/training/packing.py, and its loss with
the LM head only where a label is) vs a plain padded `Trainer`, in one run.

Run:  python -m benchmarks.bench_sft [--examples 24] [--steps 12] [--data demo|shipped]
Writes runs/bench/sft.json (under COA_LAB_RUNS if set).

Both arms use transformers' Trainer with the same LoRA model, data order and batch size; the
baseline pads each batch to its longest example and takes transformers' own causal-LM loss.
Data: the demo's kept trajectories (runs/demo/distill/kept.jsonl, what `make demo` trains on)
when they exist, else the shipped ToRA GSM8K + FireAct HotpotQA trajectories.
Printed: seconds, tokens/s (real tokens of the examples, padding excluded: the same count for
both arms, so the ratio of tokens/s is the speed-up), achieved FLOP/s and its fraction of the
machine's measured matmul peak in the dtype the CPU computes in -- FLOPs counted as
4 x parameters per token the arm computes (forward + the input gradient of the backward;
LoRA's own weight gradients are under 1% of that), attention ignored -- and how many token
positions each arm computes per real token (padding, or prefixes shared once).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


from benchmarks.results import save  # noqa: E402

from coa_lab.config import get_preset  # noqa: E402
from coa_lab.distill.importers import load_imported  # noqa: E402
from coa_lab.generation.models import load_model  # noqa: E402
from coa_lab.paths import DATASETS_DIR, runs_dir  # noqa: E402
from coa_lab.machine import machine_peak  # noqa: E402
from coa_lab.training.sft import collator, encode_example, masked_trainer, pad_batch, record_messages  # noqa: E402
from coa_lab.trajectories import load_records  # noqa: E402


def train(preset, rows, steps: int, lab: bool, out: Path) -> tuple[float, int, int]:
    """(seconds, token positions computed, real tokens) of `steps` optimizer steps of batch
    `preset.sft.batch_size` (model load excluded), counted on the batches the Trainer built."""
    import torch
    from transformers import Trainer, TrainingArguments

    from coa_lab.generation.models import cpu_autocast_enabled

    torch.manual_seed(preset.seed)
    model, tokenizer = load_model(preset.model, trainable=True)
    cuda = torch.cuda.is_available()
    args = TrainingArguments(bf16=(cuda and preset.model.dtype == "bfloat16") or (not cuda and cpu_autocast_enabled(preset.model)),
                             output_dir=str(out), max_steps=steps, per_device_train_batch_size=preset.sft.batch_size,
                             learning_rate=preset.sft.learning_rate, logging_steps=steps, save_strategy="no",
                             report_to="none", remove_unused_columns=False, use_cpu=not cuda,
                             seed=preset.seed, dataloader_num_workers=0, disable_tqdm=True)
    build = collator(model, tokenizer.pad_token_id) if lab else (lambda b: pad_batch(b, tokenizer.pad_token_id))
    counts = [0, 0]

    def counting(batch):
        out = build(batch)
        counts[0] += out["input_ids"].numel()
        counts[1] += sum(len(r["input_ids"]) for r in batch)
        return out

    cls = masked_trainer() if lab else Trainer  # the lab's is what coa_lab.training.sft.train_sft builds
    trainer = cls(model=model, args=args, train_dataset=rows, data_collator=counting)
    t0 = time.perf_counter()
    trainer.train()
    return time.perf_counter() - t0, counts[0], counts[1]


def training_records(data: str | None, examples: int) -> tuple[list, str]:
    """(the first `examples` trajectories, where they came from): the demo's kept ones (`data` "demo",
    the default where `make demo` wrote them) or the shipped ToRA GSM8K + FireAct HotpotQA ones."""
    demo_kept = runs_dir() / "demo" / "distill" / "kept.jsonl"
    data = data or ("demo" if demo_kept.exists() else "shipped")
    if data == "demo":
        if not demo_kept.exists():
            raise SystemExit(f"--data demo needs {demo_kept}: run `make demo` first (or use --data shipped)")
        return load_records(demo_kept)[:examples], "the demo's kept trajectories (runs/demo/distill/kept.jsonl)"
    records = [t.to_record() for t in load_imported(DATASETS_DIR / "trajectories" / "tora70b_gsm8k.jsonl")]
    records += [t.to_record() for t in load_imported(DATASETS_DIR / "trajectories" / "fireact_hotpotqa_react.jsonl")]
    return records[:examples], "shipped trajectories (ToRA GSM8K + FireAct HotpotQA)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=24)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--preset", default="cpu-tiny")
    ap.add_argument("--data", choices=["demo", "shipped"], default=None)
    args = ap.parse_args()
    preset = get_preset(args.preset)
    records, source = training_records(args.data, args.examples)
    model, tokenizer = load_model(preset.model)
    n_params = sum(p.numel() for p in model.parameters())
    rows = [encode_example(tokenizer, record_messages(r), r.text, preset.sft.max_length) for r in records]
    for r in rows:
        r.pop("n_observation_tokens")
    batch = preset.sft.batch_size
    print(f"{len(rows)} examples from {source}, {args.steps} steps of {batch}")
    runs = runs_dir() / "bench" / "sft"
    lab_s, packed, tokens = train(preset, rows, args.steps, True, runs / "lab")
    base_s, padded, tokens_plain = train(preset, rows, args.steps, False, runs / "plain")
    assert tokens == tokens_plain, "both arms must see the same batches"
    peak = machine_peak(preset)
    dtype_peak = peak["bf16_gflops"] if peak["bf16_autocast"] else peak["fp32_gflops"]

    def arm(seconds: float, computed: int) -> dict:
        gflops = 4 * n_params * computed / seconds / 1e9
        return {"seconds": round(seconds, 1), "tokens_per_s": round(tokens / seconds, 1),
                "positions_computed": computed, "achieved_gflops": round(gflops, 1),
                "fraction_of_peak": round(gflops / dtype_peak, 2)}

    result = {"data": source, "examples": len(rows), "steps": args.steps, "batch": batch, "tokens": tokens,
              "padded_positions_per_token": round(padded / tokens, 3),
              "packed_positions_per_token": round(packed / tokens, 3), "params": n_params,
              "lab_packed": arm(lab_s, packed), "plain_trainer_padded": arm(base_s, padded),
              "speedup": round(base_s / lab_s, 2), "peak_used_gflops": dtype_peak,
              "peak_dtype": "bf16" if peak["bf16_autocast"] else "fp32", "machine": peak}
    for name, key, secs in (("lab (packed)", "lab_packed", lab_s), ("plain Trainer", "plain_trainer_padded", base_s)):
        a = result[key]
        print(f"  {name:<14}: {secs:6.1f} s  {a['tokens_per_s']:6.1f} tok/s  "
              f"{a['achieved_gflops']} GFLOP/s = {a['fraction_of_peak']:.0%} of the {result['peak_dtype']} peak")
    print(f"  positions computed per real token: packed {result['packed_positions_per_token']}, "
          f"padded {result['padded_positions_per_token']}")
    print(f"speed-up {result['speedup']}x (goal 1.5x); goal >= 40% of peak")
    save("sft", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
