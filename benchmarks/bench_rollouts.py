"""Benchmark multi-turn tool rollouts: the lab's cache-keeping decoder vs re-prefilling.

Run:  python -m benchmarks.bench_rollouts [--tasks 32] [--adapter DIR]
Writes runs/bench/rollouts.json (under COA_LAB_RUNS if set).

Measured in ONE run on the same model, tasks and batch (ratios are what carry over between
machines; absolute figures are printed beside the machine's measured matmul peaks):
  1. `run_coa` through `coa_lab.generation.decoding` (KV cache kept across tool turns, finished rows
     leave the batch);
  2. `run_coa` through a per-turn `transformers.generate` backend (the whole prefix is
     prefilled again at every tool turn, every row pays until the batch's slowest is done);
  3. plain single-turn `transformers.generate` of the same number of new tokens per row
     (EOS suppressed), the ceiling a multi-turn rollout is compared against (goal >= 0.7x).
Tasks: held-out tool-arithmetic questions. With an SFT adapter (default: runs/demo/sft/adapter
when it exists) the policy really calls the code tool, so rollouts have several turns.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


from benchmarks.results import demo_adapter, save  # noqa: E402

from coa_lab.student_rollout import run_coa  # noqa: E402
from coa_lab.config import get_preset  # noqa: E402
from coa_lab.generation.hf_generator import HFGenerator  # noqa: E402
from coa_lab.generation.models import compute_context, load_model  # noqa: E402
from coa_lab.generation.result import Generation  # noqa: E402
from coa_lab.pipeline import draw_tasks, make_tools  # noqa: E402
from coa_lab.machine import machine_peak  # noqa: E402


class TransformersTurns:
    """The pre-engine baseline: one `transformers.generate` call per turn (no `multi_turn`,
    so `run_coa` re-sends each rollout's whole prefix at every turn)."""

    def __init__(self, model, tokenizer, batch_size, compute):
        self.model, self.tokenizer, self.batch_size, self.compute = model, tokenizer, batch_size, compute

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stop=()):
        import torch

        tok, out = self.tokenizer, []
        for start in range(0, len(prompts), self.batch_size):
            batch = prompts[start:start + self.batch_size]
            width = max(len(p) for p in batch)
            ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in batch])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
            with torch.no_grad(), self.compute():
                seqs = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                           do_sample=temperature > 0, use_cache=True, stop_strings=list(stop),
                                           tokenizer=tok, pad_token_id=tok.pad_token_id,
                                           eos_token_id=tok.eos_token_id)
            for row, p in zip(seqs[:, width:].tolist(), batch):
                finish = "length"
                if tok.eos_token_id in row:
                    row, finish = row[: row.index(tok.eos_token_id) + 1], "eos"
                text = tok.decode(row)
                for s in stop:  # keep up to the token that completed the stop string
                    if s in text:
                        k = next(k for k in range(1, len(row) + 1) if s in tok.decode(row[:k]))
                        row, text, finish = row[:k], tok.decode(row[:k]), "stop"
                        break
                out.append(Generation(row, text, finish, len(p)))
        return out


def timed_rollouts(gen, tasks, tools, preset):
    t0 = time.perf_counter()
    rollouts = run_coa(gen, tasks, tools, preset.gen, temperature=0.0)
    seconds = time.perf_counter() - t0
    policy = sum(r.policy_tokens for r in rollouts)
    return {"seconds": round(seconds, 1), "policy_tokens": policy,
            "observation_tokens": sum(len(r.response_ids) - r.policy_tokens for r in rollouts),
            "tool_calls": sum(r.tool_calls for r in rollouts),
            "turns_per_rollout": round(sum(r.tool_calls + 1 for r in rollouts) / len(rollouts), 2),
            "policy_tokens_per_s": round(policy / seconds, 1),
            "tasks_per_minute": round(len(tasks) / seconds * 60, 1),
            "answers": [r.text[-40:] for r in rollouts]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--adapter", type=Path, default=None)
    ap.add_argument("--preset", default="cpu-tiny")
    args = ap.parse_args()
    preset = get_preset(args.preset)
    adapter = demo_adapter(args.adapter)
    model, tok = load_model(preset.model, adapter=adapter)
    compute = lambda: compute_context(model, preset.model)  # noqa: E731
    tasks = draw_tasks(preset, {"math/arith": args.tasks}, "eval")
    tools = make_tools(preset)
    batch = min(preset.gen.batch_size, len(tasks))
    print(f"model {preset.model.name}" + (f" + adapter {adapter}" if adapter else " (no adapter: mostly 1-turn)"))
    print(f"{len(tasks)} held-out arith tasks, batch {batch}, greedy, per-turn cap {preset.gen.max_new_tokens}")

    engine = timed_rollouts(HFGenerator(model, tok, batch, compute=compute), tasks, tools, preset)
    print(f"  kv-keeping decoder : {engine['seconds']:7.1f} s  {engine['policy_tokens_per_s']:6.1f} policy tok/s  "
          f"{engine['turns_per_rollout']} turns/rollout")
    turns = timed_rollouts(TransformersTurns(model, tok, batch, compute), tasks, tools, preset)
    print(f"  generate per turn  : {turns['seconds']:7.1f} s  {turns['policy_tokens_per_s']:6.1f} policy tok/s")

    # single-turn ceiling: the same number of new tokens per row, in one generate call
    import torch

    from coa_lab import protocol
    from coa_lab.prompts import task_messages
    from coa_lab.generation.chat_prompt import chat_prompt_ids

    per_row = max(1, round(engine["policy_tokens"] / len(tasks)))
    prompts = [chat_prompt_ids(tok, task_messages(t.profile, t.question, protocol.PROFILE_TOOLS[t.profile])) for t in tasks]
    t0 = time.perf_counter()
    for start in range(0, len(prompts), batch):
        chunk = prompts[start:start + batch]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        with torch.no_grad(), compute():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=per_row, min_new_tokens=per_row,
                           do_sample=False, pad_token_id=tok.pad_token_id)
    single_s = time.perf_counter() - t0
    single_tps = per_row * len(prompts) / single_s
    print(f"  single-turn ceiling: {single_s:7.1f} s  {single_tps:6.1f} new tok/s ({per_row} tokens/row)")

    same = sum(a == b for a, b in zip(engine.pop("answers"), turns.pop("answers")))
    result = {
        "tasks": len(tasks), "batch": batch, "adapter": str(adapter) if adapter else None,
        "engine": engine, "generate_per_turn": turns,
        "single_turn": {"seconds": round(single_s, 1), "tokens_per_row": per_row, "tokens_per_s": round(single_tps, 1)},
        "speedup_vs_generate_per_turn": round(turns["seconds"] / engine["seconds"], 2),
        "multi_turn_vs_single_turn": round(engine["policy_tokens_per_s"] / single_tps, 2),
        "same_greedy_endings": f"{same}/{len(tasks)}",
        "machine": machine_peak(preset),
    }
    print(f"speed-up over generate-per-turn: {result['speedup_vs_generate_per_turn']}x; "
          f"multi-turn policy tok/s vs single-turn: {result['multi_turn_vs_single_turn']}x (goal >= 0.7); "
          f"same greedy endings {result['same_greedy_endings']}")
    save("rollouts", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
