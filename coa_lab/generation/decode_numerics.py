"""How the CPU decoder computes: the numeric mode it enters around a decode (generation/decoding.py).

On a CPU with bf16 units the model is held in bf16 end to end, its Linears run on weights packed
once for oneDNN, and the LM head is handed a contiguous input; elsewhere (fp32 CPUs, GPUs) the
forward runs under the caller's `compute` context as the trainer's does. The two module flags
switch the parts off, for the benchmark's arms (benchmarks/bench_decode.py).
"""

from __future__ import annotations

import contextlib

import torch

from coa_lab.generation.cpu_linear import packed_linears
from coa_lab.generation.models import hold_frozen_linears, hold_in_dtype


@contextlib.contextmanager
def frozen_linears_in_autocast_dtype(model):
    """While decoding under autocast, the frozen fp32 Linear weights held in the autocast dtype
    (generation/models.hold_frozen_linears: the very values autocast would cast them to, so the
    tokens and log-probs are bit-identical, tested); the fp32 tensors are back on exit. Entered
    after any LoRA merge, which stays fp32 and exact. Yields how many tensors it holds."""
    device = next(model.parameters()).device.type
    if not torch.is_autocast_enabled(device):
        yield 0
        return
    with hold_frozen_linears(model, torch.get_autocast_dtype(device)) as n:
        yield n


COMPUTE_DTYPE = True  # CPU: the model held in autocast's dtype (False: per-op autocast, the decoder before; a benchmark arm)
PACKED = True  # CPU: Linear weights packed once for oneDNN (cpu_linear.py; False: F.linear; a benchmark arm)


def cpu_autocast_dtype(model, compute) -> "torch.dtype | None":
    """The dtype `compute` (generation/models.compute_context) autocasts a CPU model to, else None."""
    if compute is None or next(model.parameters()).device.type != "cpu":
        return None
    with compute():
        return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None


@contextlib.contextmanager
def numeric_mode(model, compute, rows: int = 64):
    """How the decoder computes. On a CPU with bf16 units (compute autocasts to bf16): the whole
    model held in bf16 and no autocast (models.hold_in_dtype: weights, activations and the KV cache
    in bf16, the cost of a re-cast per op gone). Elsewhere: `compute` as given (fp32; a GPU's
    autocast, with the frozen weights held as it would cast them). On a CPU the Linears then run
    on weights packed once for oneDNN (cpu_linear.packed_linears, sized for `rows`), and either
    way the LM head gets a contiguous input (_contiguous_head_input). Entered after any LoRA merge
    (exact in fp32)."""
    dtype = cpu_autocast_dtype(model, compute) if COMPUTE_DTYPE else None
    with contextlib.ExitStack() as stack:
        if dtype is not None:
            stack.enter_context(hold_in_dtype(model, dtype))
        else:
            stack.enter_context(compute() if compute else contextlib.nullcontext())
            stack.enter_context(frozen_linears_in_autocast_dtype(model))
        cpu = next(model.parameters()).device.type == "cpu"
        if PACKED and cpu and not torch.is_autocast_enabled("cpu"):  # oneDNN's packed op knows no autocast
            stack.enter_context(packed_linears(model, rows))
        stack.enter_context(_contiguous_head_input(model))
        yield


@contextlib.contextmanager
def _contiguous_head_input(model):
    """The LM head's input made contiguous. Why: a prefill keeps one row of logits
    (logits_to_keep=1), so the head gets hidden[:, -1:], a strided view, and torch's matmul runs
    that [rows, 1, d] x [d, vocab] as a batched product over an expanded copy of the head, one
    per row: measured on CPU for 24 rows of SmolLM2, 1,761 ms in bf16 and 112 ms in fp32 where the
    contiguous product takes 5 and 10 ms (benchmarks/bench_decode.py's prefill)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        yield
        return
    handle = head.register_forward_pre_hook(lambda module, args: (args[0].contiguous(), *args[1:]))
    try:
        yield
    finally:
        handle.remove()
