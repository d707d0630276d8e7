"""Lesson 06's exercises, read off the memory planner: what sharding does not divide, what gradient
checkpointing saves, and what the chunked LM head saves on each preset."""

from __future__ import annotations

from coa_lab.config import get_preset
from coa_lab.lessons.exercises.registry import Exercise, register
from coa_lab.planning.memory_plan import plan

# the training-memory terms the lesson's stacked bar chart draws (plan(...).to_dict() keys)
TERMS = ("weights_gib", "gradients_gib", "optimizer_gib", "activations_gib", "logits_gib")


def _stops_shrinking(preset_name: str = "multinode-32b", gpus=(8, 16, 64)) -> list[str]:
    plans = [plan(get_preset(preset_name), g).to_dict() for g in gpus]
    return [t for t in TERMS if len({p[t] for p in plans}) == 1]


def _names(terms) -> set[str]:
    """"activations" and "activations_gib" name the same term."""
    return {str(t).removesuffix("_gib") for t in terms}


register(Exercise(
    id="06.stops_shrinking",
    question="Plan the 32B preset (multinode-32b) on 8, 16 and 64 GPUs: which training-memory terms do not "
             "shrink as GPUs are added? Answer a list of term names, e.g. [\"weights_gib\"].",
    truth=_stops_shrinking,
    hint="ZeRO-3 divides what is per parameter (weights, gradients, optimizer states) by the GPUs; what is per "
         "sequence stays whole on every GPU. Compare plan(p, 8), plan(p, 16) and plan(p, 64) term by term.",
    wrong=lambda right: sorted(right)[1:],  # one of them missed
    same=lambda a, b: _names(a) == _names(b),
))


def _checkpointing(preset_name: str = "gpu-3b-qlora") -> tuple[float, float]:
    return tuple(plan(get_preset(preset_name, model={"gradient_checkpointing": on}), 1).train_total_gib
                 for on in (True, False))


register(Exercise(
    id="06.checkpointing",
    question="The one-GPU preset gpu-3b-qlora plans its training step with gradient checkpointing on. What is "
             "its planned training total (train_total_gib, 1 GPU) with checkpointing on, and with it off? "
             "Answer (on, off) in GiB.",
    truth=_checkpointing,
    hint="get_preset(\"gpu-3b-qlora\", model={\"gradient_checkpointing\": False}) is the same preset with it "
         "off; only the activations term changes (activations_ckpt_gib vs activations_no_ckpt_gib).",
    wrong=lambda right: (right[0], right[1] - 1.0),
    # 2 decimals will do: the lesson's table rounds to 3
    same=lambda a, b: len(a) == len(b) and all(abs(float(x) - float(y)) <= 0.01 for x, y in zip(a, b)),
))


def _logits_factor(presets: dict, gpus: dict) -> dict[str, float]:
    return {name: plan(p, gpus[name], logits_chunk=None).logits_gib / plan(p, gpus[name]).logits_gib
            for name, p in presets.items()}


register(Exercise(
    id="06.logits",
    question="For every preset of the lesson's table, on the lesson's GPU counts (GPUS), by what factor does the "
             "chunked LM head shrink the logits term? Answer {preset name: unchunked / chunked}.",
    truth=_logits_factor,
    hint="plan(p, gpus, logits_chunk=None) is the unchunked head. The chunk holds min(batch x length, "
         "lm_head.CHUNK) positions, and a sharded full fine-tune (lora_r 0 on several GPUs) keeps the unchunked "
         "head: its factor is 1.",
    wrong=lambda right: {name: factor + 1 for name, factor in right.items()},
    # 1% will do: the factors may come from the table's rounded GiB
    same=lambda a, b: a.keys() == b.keys() and all(abs(float(a[k]) / b[k] - 1) <= 0.01 for k in b),
))
