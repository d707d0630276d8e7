"""The decoder's draw of a sampled token: inverting the cumulative sum vs torch.multinomial.

Run:  python -m benchmarks.bench_sampling [--rows 8 36 72] [--draws 40000]
Writes runs/bench/sampling.json (under COA_LAB_RUNS if set).

The logits are real: the model's next-token logits after held-out CoA prompts (arithmetic tasks
in the student's format, the demo's SFT adapter when `make demo` has written it), repeated to
fill the rows. Per row count, in ONE run, best of `--repeats`:
  - `sample_ms`: one step's `generation.sampling.sample` at the RL temperature (log-softmax,
    the draw, the drawn token's log-prob and the entropy), the draw by `sampling.draw`;
  - `multinomial_sample_ms`: the same with the draw by torch.multinomial, as before;
  - `speedup`: the ratio of the two.
Agreement (the two are the same distribution): `--draws` tokens drawn by each from one prompt's
distribution (the most uncertain of the prompts'); `tv_draw_vs_multinomial` is the total variation distance between the two
empirical distributions and `tv_multinomial_vs_multinomial` the same between two runs of
torch.multinomial itself: the sampling noise the first is judged against.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.results import demo_adapter, save
from coa_lab.config import get_preset
from coa_lab.generation import sampling
from coa_lab.generation.chat_prompt import chat_prompt_ids
from coa_lab.generation.models import compute_context, load_model
from coa_lab.machine import machine_peak
from coa_lab.pipeline import draw_tasks, make_tools
from coa_lab.prompts import task_messages
from coa_lab import protocol


def multinomial(probs):
    return torch.multinomial(probs, 1).squeeze(-1)


def real_logits(preset, adapter, n: int) -> torch.Tensor:
    """[n, vocab] next-token logits of the model after n held-out prompts (fp32)."""
    model, tok = load_model(preset.model, adapter=adapter)
    tools = make_tools(preset)
    tasks = draw_tasks(preset, {"math/arith": n}, "eval")
    prompts = [chat_prompt_ids(tok, task_messages(t.profile, t.question,
                                                  [x for x in protocol.PROFILE_TOOLS[t.profile] if x in tools]))
               for t in tasks]
    rows = []
    with torch.no_grad(), compute_context(model, preset.model):
        for ids in prompts:
            rows.append(model(input_ids=torch.tensor([ids]), logits_to_keep=1).logits[0, -1].float())
    return torch.stack(rows)


def best_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(min(times) * 1000, 3)


def step_ms(logits, temperature: float, draw, repeats: int) -> float:
    """One `sample` call with `draw` as the draw."""
    kept = sampling.draw
    sampling.draw = draw
    try:
        return best_ms(lambda: sampling.sample(logits, temperature, 1.0), repeats)
    finally:
        sampling.draw = kept


def total_variation(a: torch.Tensor, b: torch.Tensor, vocab: int) -> float:
    pa = torch.bincount(a, minlength=vocab).double() / len(a)
    pb = torch.bincount(b, minlength=vocab).double() / len(b)
    return round(float((pa - pb).abs().sum() / 2), 5)


def agreement(logits, temperature: float, draws: int) -> dict:
    """The two draws' token frequencies from one real distribution (the prompt's whose next token is
    least certain: the most tokens in play), against multinomial's own noise."""
    probs = torch.softmax(logits / temperature, -1)
    widest = int((-(probs * probs.clamp(min=1e-30).log()).sum(-1)).argmax())
    probs = probs[widest : widest + 1].expand(draws, -1).contiguous()
    torch.manual_seed(0)
    ours = sampling.draw(probs)
    first, second = multinomial(probs), multinomial(probs)
    vocab = probs.shape[-1]
    return {"draws": draws, "support_drawn": int(torch.unique(ours).numel()),
            "tv_draw_vs_multinomial": total_variation(ours, first, vocab),
            "tv_multinomial_vs_multinomial": total_variation(first, second, vocab)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="cpu-quick")
    ap.add_argument("--adapter", type=Path, default=None)
    ap.add_argument("--rows", type=int, nargs="+", default=[8, 36, 72])
    ap.add_argument("--draws", type=int, default=40_000)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    preset = get_preset(args.preset)
    adapter = demo_adapter(args.adapter)
    temperature = preset.rl.temperature
    logits = real_logits(preset, adapter, min(8, max(args.rows)))
    result = {"preset": args.preset, "temperature": temperature, "adapter": "the demo's SFT adapter" if adapter else None,
              "vocab": logits.shape[-1], "rows": []}
    for n in args.rows:
        batch = logits.repeat(-(-n // len(logits)), 1)[:n].contiguous()
        ours, theirs = step_ms(batch, temperature, sampling.draw, args.repeats), step_ms(batch, temperature, multinomial, args.repeats)
        row = {"rows": n, "sample_ms": ours, "multinomial_sample_ms": theirs, "speedup": round(theirs / ours, 2)}
        print(f"rows {n:3d}: sample {ours:7.2f} ms, with torch.multinomial {theirs:7.2f} ms (x{row['speedup']})")
        result["rows"].append(row)
    result["agreement"] = agreement(logits, temperature, args.draws)
    print(f"agreement: {result['agreement']}")
    result["machine"] = machine_peak(preset)
    save("sampling", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
