"""One rank of tests/e2e/test_multinode_engines.py and test_multinode_rendezvous.py (not a test
module itself).

    # the lab's SFT as a full fine-tune (lora_r=0, as multinode-32b's SFT) under the config's engine
    accelerate launch --config_file configs/fsdp.yaml --num_processes 2 \
        tests/e2e/multinode_worker.py full OUT RECORDS --cpu-engine        # or configs/zero3.yaml
    python tests/e2e/multinode_worker.py full OUT RECORDS --accum 2      # the single-process reference

    # tests/e2e/distributed_worker.py's LoRA SFT, recording where the launcher put this rank first
    accelerate launch ... --num_machines 2 --machine_rank R ... tests/e2e/multinode_worker.py ddp OUT RECORDS

`full` writes OUT/probe-rank<R>.jsonl: after every optimizer step the step and the logged loss,
and at the first step what this rank holds of the model (cpu_engines.holding: FSDP2 DTensor
shards, ZeRO-3 partitions); OUT/load-rank<R>.json: what it held right after `from_pretrained`
(ZeRO-3: zero.Init's partitions already) and the squared norm of that. --cpu-engine applies the
config's FSDP / DeepSpeed on CPU ranks (tests/e2e/cpu_engines.py says why accelerate needs that).

`ddp` writes OUT/env-rank<R>.json (RANK, LOCAL_RANK, GROUP_RANK, WORLD_SIZE, ... as the launcher
set them) and then runs distributed_worker.py's `sft` (probes with parameter digests).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cpu_engines, distributed_worker

from cpu_engines import holding, lift_cpu_engine_gate  # noqa: E402

from coa_lab import distributed  # noqa: E402
from coa_lab.config import get_preset  # noqa: E402

LAUNCH_ENV = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def full_preset(accum: int):
    """multinode-32b's SFT in miniature: every weight trained (lora_r=0) at its learning rate, no
    warm-up, rows cut at 192 tokens (the prompt is ~135: ~57 trained tokens a row); fp32 on the
    CPU (no bf16 autocast) so that the comparison with one process does not drown in rounding."""
    return get_preset("cpu-smoke", model={"lora_r": 0, "cpu_autocast_bf16": False},
                      sft={"epochs": 1, "batch_size": 1, "grad_accum": accum, "max_length": 192,
                           "save_steps": 0, "learning_rate": 2e-5, "warmup_ratio": 0.0})


def run_full(out: Path, records: Path, accum: int) -> None:
    from transformers import TrainerCallback

    import coa_lab.training.sft as sft
    from coa_lab.trajectories import load_records

    rank = distributed.rank()
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / f"probe-rank{rank}.jsonl", "w")
    loader = sft.load_model

    def load_and_record(*args, **kwargs):  # what from_pretrained left on this rank
        model, tokenizer = loader(*args, **kwargs)
        local = [p.ds_tensor if hasattr(p, "ds_tensor") else p for p in model.parameters()]
        norm = float(sum(t.detach().float().pow(2).sum() for t in local if t.device.type != "meta"))
        (out / f"load-rank{rank}.json").write_text(json.dumps({**holding(model), "local_sq_norm": norm}))
        return model, tokenizer

    sft.load_model = load_and_record

    class Probe(TrainerCallback):
        def on_log(self, args, state, control, logs=None, model=None, **kwargs):
            if logs and "loss" in logs:
                row = {"step": state.global_step, "loss": logs["loss"]}
                if state.global_step == 1:
                    row["holding"] = holding(model)
                log.write(json.dumps(row) + "\n")
                log.flush()

    sft.train_sft(full_preset(accum), load_records(records), out / "sft", callbacks=[Probe()])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["full", "ddp"])
    ap.add_argument("out", type=Path)
    ap.add_argument("records", type=Path)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--cpu-engine", action="store_true",
                    help="apply the launcher's FSDP / DeepSpeed on CPU ranks (tests/e2e/cpu_engines.py)")
    args = ap.parse_args(argv)
    if args.cpu_engine:
        lift_cpu_engine_gate()
    distributed.init()
    if args.mode == "full":
        run_full(args.out, args.records, args.accum)
        return 0
    import distributed_worker

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"env-rank{distributed.rank()}.json").write_text(json.dumps({k: os.environ.get(k) for k in LAUNCH_ENV}))
    distributed_worker.run_sft(args.out, args.records, args.accum, resume=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
