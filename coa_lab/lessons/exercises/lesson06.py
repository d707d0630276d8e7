"""Lesson 06's exercises, read off the memory planner: how much of a GPU sharding cannot divide, what gradient
checkpointing saves, and what the chunked LM head saves on each preset."""

from __future__ import annotations

from coa_lab.config import get_preset
from coa_lab.lessons.exercises.registry import Exercise, register
from coa_lab.planning.memory_plan import plan

# the training-memory terms the lesson's stacked bar chart draws (plan(...).to_dict() keys)
TERMS = ("weights_gib", "gradients_gib", "optimizer_gib", "activations_gib", "logits_gib")


def _per_sequence_share(preset_name: str = "multinode-32b", gpus=(8, 128)) -> list[float]:
    """Per GPU count, the share of the five training terms that is per sequence (activations + logits)."""
    shares = []
    for g in gpus:
        p = plan(get_preset(preset_name), g).to_dict()
        shares.append((p["activations_gib"] + p["logits_gib"]) / sum(p[t] for t in TERMS))
    return shares


register(Exercise(
    id="06.per_sequence_share",
    question="Plan the 32B preset (multinode-32b) on 8 and on 128 GPUs: what share of each GPU's training memory "
             "(the five terms weights, gradients, optimizer, activations, logits) is per sequence rather than per "
             "parameter? Answer [share at 8, share at 128], 3 decimals.",
    truth=_per_sequence_share,
    hint="ZeRO-3 divides what is per parameter (weights, gradients, optimizer states) by the GPUs; what is per "
         "sequence (activations, logits) stays whole on every GPU. plan(p, 8) and plan(p, 128), term by term.",
    wrong=lambda right: [1 - x for x in right],  # the per-parameter share
    same=lambda a, b: len(a) == len(b) and all(abs(float(x) - float(y)) <= 1e-3 for x, y in zip(a, b)),
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
