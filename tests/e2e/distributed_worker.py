"""One rank of tests/e2e/test_distributed.py (not a test module itself).

    accelerate launch --config_file configs/ddp.yaml --num_processes 2 tests/e2e/distributed_worker.py sft OUT RECORDS
    python tests/e2e/distributed_worker.py sft OUT RECORDS --accum 2      # the single-process reference

Writes OUT/probe-rank<R>.jsonl: after every optimizer step, the step, the logged loss and a
SHA-256 of this rank's trainable parameters (bit-identical replicas have equal digests).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from coa_lab import distributed
from coa_lab.config import get_preset


def digest(model) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        if p.requires_grad:
            h.update(name.encode())
            h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def probe_file(out: Path):
    out.mkdir(parents=True, exist_ok=True)
    return open(out / f"probe-rank{distributed.rank()}.jsonl", "w")


def run_sft(out: Path, records: Path, accum: int, resume: bool) -> None:
    from transformers import TrainerCallback

    from coa_lab.training.sft import train_sft
    from coa_lab.trajectories import load_records

    # fp32 (no CPU bf16 autocast): the comparison with one process must not drown in rounding
    preset = get_preset("cpu-smoke", model={"cpu_autocast_bf16": False},
                        sft={"epochs": 1, "batch_size": 1, "grad_accum": accum, "max_length": 256, "save_steps": 2})
    log = probe_file(out)

    class Probe(TrainerCallback):
        def on_log(self, args, state, control, logs=None, model=None, **kwargs):
            if logs and "loss" in logs:
                log.write(json.dumps({"step": state.global_step, "loss": logs["loss"], "params": digest(model)}) + "\n")
                log.flush()

    train_sft(preset, load_records(records), out / "sft", callbacks=[Probe()], resume=resume)


def run_rl(out: Path, steps: int, resume: bool) -> None:
    from coa_lab.generation.result import Generation
    from coa_lab.rl.trainer import train_rl
    from coa_lab.tasks.records import Task
    from coa_lab.tools.registry import build_tools

    preset = get_preset("cpu-smoke", model={"cpu_autocast_bf16": False},
                        rl={"steps": steps, "prompts_per_step": 3, "group_size": 4, "max_sampling_rounds": 0,
                            "anchors_per_step": 1, "mini_batches": 2, "save_steps": 1})
    tasks = [Task(f"t{i}", f"What is {i} + {i}?", [str(2 * i)], "test", "math", {}) for i in range(1, 9)]

    class HalfRight:
        """A policy whose rollouts do not depend on how rows are split over ranks: sample s of
        a question (its index in the group, read from the prompt's repeat count) answers right
        when s is even; the code tool runs for real on the right ones. So one process and two
        ranks train on the same rollouts, and every group is mixed."""

        def __init__(self, tok):
            self.tokenizer = tok

        def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stop=()):
            out, seen = [], {}
            for p in prompts:
                after = self.tokenizer.decode(p).rsplit("What is ", 1)[1]  # the question and the reply so far
                q = after.split("?")[0]
                a, b = (int(x) for x in q.split(" + "))
                if "<observation>" in after:  # second turn: answer with what the tool printed
                    reply = f"<think>t</think><answer>\\boxed{{{a + b}}}</answer>"
                else:
                    s = seen[q] = seen.get(q, -1) + 1
                    reply = (f"<think>add them</think><code>print({a} + {b})</code>" if s % 2 == 0
                             else f"<think>t</think><answer>\\boxed{{{a + b + 1}}}</answer>")
                ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"]
                out.append(Generation(ids, self.tokenizer.decode(ids), "stop", len(p)))
            return out

    log = probe_file(out)

    def probe(step, row, model):
        log.write(json.dumps({"step": step, "loss": row.get("loss"), "accuracy": row["accuracy"],
                              "params": digest(model)}) + "\n")
        log.flush()

    train_rl(preset, tasks[:6], build_tools(["code"]), out / "rl", generator_factory=lambda m, t: HalfRight(t),
             anchors=tasks[6:], resume=resume, on_step=probe)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["sft", "rl"])
    ap.add_argument("out", type=Path)
    ap.add_argument("records", type=Path, nargs="?")
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args(argv)
    distributed.init()
    if args.mode == "sft":
        run_sft(args.out, args.records, args.accum, args.resume)
    else:
        run_rl(args.out, args.steps, args.resume)
    return 0


if __name__ == "__main__":
    sys.exit(main())
