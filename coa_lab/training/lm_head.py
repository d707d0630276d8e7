"""Next-token log-probs without a [tokens x vocabulary] logits tensor.

The LM head is the largest tensor of a long-context step: at 8k tokens and Qwen2.5's 151,936
words, one row's fp32 logits are 4.6 GiB, and autograd keeps them (and their softmax) until the
backward pass. Here the model runs with its head fed an empty slice (a forward pre-hook takes the
hidden states it was about to project), and the head is applied to `CHUNK` positions at a time,
each chunk under activation checkpointing: the forward keeps only each token's log-prob, the
backward recomputes one chunk's logits at a time. Peak memory for the head: one chunk's logits
and their gradient, whatever the sequence length.

The numbers are the full computation's: the same head module (a LoRA- or 4-bit-wrapped head
included) on the same hidden states, the same fp32 cross-entropy (tests/training/test_lm_head.py checks
log-probs, losses and gradients against the plain path; benchmarks/bench_lm_head_memory.py
measures the peak on CPU). Every loss and log-prob of the lab goes through `nll_at`: SFT's
masked loss (coa_lab/training/sft.py) and RL's token log-probs (rl/dapo.py, training/packing.py).

On a GPU with liger-kernel >= 0.8.2 installed (the `[gpu]` extra), a plain (unwrapped,
unquantized) head goes through Liger's fused linear-cross-entropy kernel instead: the same
values, the logits never leaving the kernel's own chunks. 0.8.2 is the first release whose
per-token (reduction="none") gradients are right: before it every token's gradient was scaled
by the first token's upstream gradient (linkedin/Liger-Kernel#1298), which a DAPO loss, weighted
per token, would have trained on silently. COA_LAB_FUSED_CE=0 keeps the chunked path.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from importlib import metadata

# (torch is imported inside the functions: `coa-lab plan` reads CHUNK without it)
# tokens per LM-head chunk: [1024 x 49,152] fp32 logits are 192 MiB (SmolLM2), [1024 x 151,936]
# 594 MiB (Qwen2.5); the matmul per chunk stays large enough to run at the machine's peak
CHUNK = 1024
FUSED_MIN_VERSION = (0, 8, 2)  # liger-kernel: per-token gradients right from this release on
FUSED_DEVICES = ("cuda",)  # Triton kernels (the tests point this at "cpu" with a reference kernel)
log = logging.getLogger(__name__)
# True: every position's logits at once, the path the chunking replaced. Only for measuring it
# (benchmarks/gpu_validate.py); nothing else sets it.
UNCHUNKED = False
# positions that went through the fused kernel since import: how a measurement proves which path ran
# (benchmarks/gpu_validate.py records it beside each "fused" figure)
FUSED_POSITIONS = 0


def _unwrap(model):
    """The model inside a DistributedDataParallel (or other `.module`) wrapper: the wrapper is
    what runs the forward (its gradient hooks), the inner model owns the head."""
    while getattr(model, "get_output_embeddings", None) is None and hasattr(model, "module"):
        model = model.module
    return model


def _sharded(module) -> bool:
    """Whether the module's weights are sharded across ranks (ZeRO-3, FSDP): then its head is only
    whole inside the engine's own forward, so the plain path is taken (see nll_at)."""
    return any(hasattr(p, "ds_id") or type(p).__name__ in ("DTensor", "FlatParameter") for p in module.parameters())


@contextlib.contextmanager
def _captured_head_input(model):
    """Inside: the model's forward skips its LM head (the head sees an empty slice of positions)
    and `box[0]` receives the hidden states the head would have projected, [R, K, H]."""
    head = _unwrap(model).get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embeddings (LM head) to score tokens with")
    box: list = []

    def take(module, args):
        box.append(args[0])
        return (args[0][:, :0],)  # the head now projects zero positions: no [K, V] logits at all

    handle = head.register_forward_pre_hook(take)
    try:
        yield head, box
    finally:
        handle.remove()


def _softcap(model) -> float | None:
    """Gemma-style final logit soft-capping, applied by such models after their head."""
    config = getattr(_unwrap(model), "config", None)
    return getattr(config, "final_logit_softcapping", None) if config is not None else None


def _chunk_nll(head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, softcap,
               ignore_index: int):
    import torch

    logits = head(hidden).float()  # [c, V]: the only logits alive at any moment
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return torch.nn.functional.cross_entropy(logits / temperature, targets, reduction="none", ignore_index=ignore_index)


@functools.cache
def _liger_kernel():
    """Liger's fused linear cross-entropy, or None where liger-kernel is absent or too old."""
    try:
        version = tuple(int(x) for x in metadata.version("liger-kernel").split(".")[:3] if x.isdigit())
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy  # late: [gpu] extra
    except Exception:  # not installed, no triton, an unparsable version: the chunked path
        return None
    if version < FUSED_MIN_VERSION:
        log.warning("liger-kernel %s is older than %s (wrong per-token gradients): the LM head runs chunked",
                    ".".join(map(str, version)), ".".join(map(str, FUSED_MIN_VERSION)))
        return None
    log.info("LM head: liger-kernel %s's fused linear cross-entropy", ".".join(map(str, version)))
    return liger_fused_linear_cross_entropy


def _fused_kernel(head, hidden, temperature: float, softcap):
    """The fused kernel for this head, or None: only on CUDA, only for a plain nn.Linear head (a
    LoRA- or 4-bit-wrapped head computes more than `weight`), and only where its softcap-then-CE
    is ours (we divide by T after the cap; the kernel cannot)."""
    import torch

    if os.environ.get("COA_LAB_FUSED_CE", "1") == "0" or hidden.device.type not in FUSED_DEVICES:
        return None
    if type(head) is not torch.nn.Linear or (softcap and temperature != 1.0):
        return None
    return _liger_kernel()


def _fused_nll(kernel, head, hidden, targets, temperature: float, softcap, ignore_index: int):
    """-log softmax((hidden W^T + b) / T)[target] through the fused kernel: (h W^T + b) / T is
    (h / T) W^T + b / T, so the temperature scales the kernel's inputs."""
    global FUSED_POSITIONS
    FUSED_POSITIONS += hidden.shape[0]
    bias = None if head.bias is None else head.bias / temperature
    out = kernel(hidden / temperature if temperature != 1.0 else hidden, head.weight, targets, bias=bias,
                 ignore_index=ignore_index, reduction="none", softcap=softcap or None)
    return (out.loss if hasattr(out, "loss") else out).float()


def chunked_nll(model, head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                chunk: int = CHUNK, ignore_index: int = -100) -> torch.Tensor:
    """-log softmax(head(hidden) / T)[target] per position: hidden [N, H], targets [N] -> [N] fp32.
    Targets equal to `ignore_index` get 0. With gradients on, each chunk is checkpointed: its
    logits are dropped after the forward and recomputed in the backward. On a GPU with a recent
    liger-kernel, a plain head goes through its fused kernel instead (module docstring)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    softcap = _softcap(model)
    kernel = _fused_kernel(head, hidden, temperature, softcap) if hidden.shape[0] else None
    if kernel is not None:
        return _fused_nll(kernel, head, hidden, targets, temperature, softcap, ignore_index)
    out = []
    for i in range(0, hidden.shape[0], chunk):
        h, t = hidden[i : i + chunk], targets[i : i + chunk]
        if torch.is_grad_enabled() and (h.requires_grad or any(p.requires_grad for p in head.parameters())):
            out.append(checkpoint(_chunk_nll, head, h, t, temperature, softcap, ignore_index, use_reentrant=False))
        else:
            out.append(_chunk_nll(head, h, t, temperature, softcap, ignore_index))
    return torch.cat(out) if out else hidden[:0, 0].float()  # empty, but still on the graph for backward


def _returned_all(states: torch.Tensor, columns: torch.Tensor, length: int) -> bool:
    """Whether a forward asked for `columns` (sorted, unique) of `length` positions returned all
    of them instead: the pinned unsloth (2026.10.9, models/llama.py) replaces a tensor
    `logits_to_keep` by 0, "keep everything", so an index meant for the kept columns alone would
    read other positions, silently. When K == length both readings agree (columns = 0..L-1)."""
    if states.shape[1] == len(columns):
        return False
    if states.shape[1] != length:
        raise ValueError(f"the forward returned {states.shape[1]} positions for {len(columns)} kept "
                         f"columns of a {length}-token row")
    return True


def hidden_at(model, inputs: dict, columns: torch.Tensor):
    """(head, hidden [R, K, H]): the final hidden states at `columns` (sorted, unique) of every row,
    from one forward whose LM head projects nothing. A model that ignores the tensor
    `logits_to_keep` (unsloth) hands the head every position: the columns are picked here, from
    hidden states the head never projected (cheap)."""
    with _captured_head_input(model) as (head, box):
        model(**inputs, logits_to_keep=columns.to(inputs["input_ids"].device))
    if not box:
        raise ValueError(f"{type(model).__name__}'s forward never called its LM head")
    hidden = box[0]
    if _returned_all(hidden, columns, inputs["input_ids"].shape[1]):
        hidden = hidden[:, columns.to(hidden.device)]
    return head, hidden


def nll_at(model, inputs: dict, rows: torch.Tensor, columns: torch.Tensor, targets: torch.Tensor,
           temperature: float = 1.0, chunk: int = CHUNK, ignore_index: int = -100) -> torch.Tensor:
    """-log p(targets[k]) predicted at position (rows[k], columns[k]): [K] fp32, the LM head run
    only on the columns some target needs, CHUNK positions at a time."""
    import torch

    keep, where = torch.unique(columns, return_inverse=True)
    head = _unwrap(model).get_output_embeddings()
    if head is not None and (UNCHUNKED or _sharded(head)):
        # ZeRO-3 / FSDP gather a layer's weights around the engine's own forward only: calling
        # the head outside it is not proven here (no multi-GPU run), so sharded full fine-tunes
        # keep the unchunked head, and `coa-lab plan` counts their whole logits
        device = inputs["input_ids"].device
        logits = model(**inputs, logits_to_keep=keep.to(device)).logits
        # every position back (unsloth ignores a tensor logits_to_keep): index the columns themselves
        at = keep[where] if _returned_all(logits, keep, inputs["input_ids"].shape[1]) else where
        logits = logits[rows.to(device), at.to(device)].float()
        return torch.nn.functional.cross_entropy(logits / temperature, targets.to(device), reduction="none",
                                                 ignore_index=ignore_index)
    head, hidden = hidden_at(model, inputs, keep)
    device = hidden.device
    picked = hidden[rows.to(device), where.to(device)]  # [K, H]
    return chunked_nll(model, head, picked, targets.to(device), temperature, chunk, ignore_index)


def check_temperature(temperature: float) -> float:
    """The policy's temperature as a divisor; greedy (0) has no log-probs to train on."""
    if not temperature > 0:
        raise ValueError(f"log-probs need a sampling temperature > 0, got {temperature!r} "
                         "(greedy decoding is not a policy to train)")
    return float(temperature)
