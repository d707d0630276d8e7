"""Peak memory of the LM head's part of a training step, before and after chunking
(coa_lab/training/lm_head.py, 2026-11-26).

Run:  python -m benchmarks.bench_lm_head_memory [--lengths 2048 4096] [--vocab 151936]
Writes runs/bench/lm_head_memory.json (under COA_LAB_RUNS if set).

The model: a random-weight Llama with Qwen2.5's vocabulary (151,936) and a small body (hidden
128, 2 layers), so the logits are what sets the peak, as they do for a 3B model at 8k tokens
(docs/scaling.md), while the step stays cheap on a CPU. For each length, four arms, each in a
fresh process (ru_maxrss is a high-water mark): the SFT loss + backward and RL's token
log-probs + backward, each unchunked (one [L, V] logits tensor, the lab's computation before
the chunked head) and chunked (coa_lab/training/lm_head.py, what sft.masked_lm_loss and training/logprobs.token_logprobs
now run). Reported: the step's peak above the process's resident size before it (MiB), and the
ratio. The loss values of the two paths are printed side by side (they agree to fp32 rounding;
tests/training/test_lm_head.py checks values and gradients).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time



def arm(kind: str, chunked: bool, length: int, vocab: int) -> dict:
    """One step in this process: its peak memory above the resident size before it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from coa_lab.training.logprobs import token_logprobs
    from coa_lab.training.sft import masked_lm_loss

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=128, intermediate_size=256,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=length))
    ids = torch.randint(0, vocab, (1, length))
    attention = torch.ones_like(ids)
    labels = ids.clone()
    prompt = length // 8
    labels[:, :prompt] = -100
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if chunked:
        if kind == "sft":
            loss = masked_lm_loss(model, {"input_ids": ids, "attention_mask": attention, "labels": labels})
        else:
            loss = -token_logprobs(model, ids, attention, start=prompt, temperature=0.8)[:, prompt:].mean()
    else:  # the unchunked computation: the LM head on every needed position at once
        logits = model(input_ids=ids, attention_mask=attention, logits_to_keep=length - prompt + 1).logits[:, :-1]
        if kind == "sft":
            loss = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), labels[:, prompt:],
                                                     ignore_index=-100)
        else:
            nll = torch.nn.functional.cross_entropy((logits.float() / 0.8).transpose(1, 2), ids[:, prompt:],
                                                    reduction="none")
            loss = nll.mean()
    loss.backward()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_mib": round((peak - before) / 1024, 1), "seconds": round(seconds, 2), "loss": float(loss)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--arm", nargs=4, metavar=("KIND", "CHUNKED", "LENGTH", "VOCAB"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm:  # a child process: one arm, its figures on stdout
        kind, chunked, length, vocab = args.arm
        print(json.dumps(arm(kind, chunked == "1", int(length), int(vocab))))
        return 0

    from benchmarks.results import save

    from coa_lab.config import get_preset
    from coa_lab.training.lm_head import CHUNK
    from coa_lab.machine import machine_peak

    rows = []
    for length in args.lengths:
        for kind in ("sft", "rl"):
            got = {}
            for chunked in (False, True):
                out = subprocess.run([sys.executable, __file__, "--arm", kind, str(int(chunked)), str(length), str(args.vocab)],
                                     capture_output=True, text=True, check=True)
                got["chunked" if chunked else "unchunked"] = json.loads(out.stdout.strip().splitlines()[-1])
            row = {"kind": kind, "length": length, **got,
                   "peak_ratio": round(got["chunked"]["peak_mib"] / max(got["unchunked"]["peak_mib"], 1e-9), 3)}
            rows.append(row)
            print(f"{kind} at {length} tokens: unchunked {got['unchunked']['peak_mib']:.0f} MiB "
                  f"({got['unchunked']['seconds']:.1f} s, loss {got['unchunked']['loss']:.5f}), chunked "
                  f"{got['chunked']['peak_mib']:.0f} MiB ({got['chunked']['seconds']:.1f} s, loss "
                  f"{got['chunked']['loss']:.5f}): x{row['peak_ratio']}")
    save("lm_head_memory", {"vocab": args.vocab, "chunk": CHUNK, "rows": rows,
                            "machine": machine_peak(get_preset("cpu-tiny"))})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
