"""Linear layers with their weights packed once for oneDNN, for the CPU decoder.

A CPU matmul through `F.linear` hands oneDNN a plain weight, which it reorders into its blocked
layout on every call: one more read and write of each weight per decode step. Packed once per
decode call (the weights are frozen while it runs), every step reads the packed copy. This is
what torch.compile's CPU "freezing" does to a frozen model's Linears (inductor's mkldnn weight
packing); the decoder's own cache and Python loop keep it out of a compiled graph, so the same
two oneDNN operators are applied directly. Measured on a 2-core bf16 (AMX) draw, 120 cold
1536x576 bf16 weights at 72 rows: 28.6 ms through F.linear, 21.8 ms packed (identical output).

Only bf16, where oneDNN has the units for it (AVX512-BF16/AMX, which `models.cpu_bf16_is_fast`
already decided on); anything else keeps F.linear: `packed_linears` yields how many it packed.
"""

from __future__ import annotations

import contextlib

import torch


def can_pack(dtype) -> bool:
    """Whether this torch build packs Linear weights of `dtype` for oneDNN on this CPU."""
    ops = getattr(torch.ops, "mkldnn", None)
    if not torch.backends.mkldnn.is_available() or ops is None:
        return False
    try:
        ops._reorder_linear_weight, ops._linear_pointwise  # noqa: B018  (present in this build?)
    except (AttributeError, RuntimeError):
        return False
    # bf16 only: fp32 packing is unmeasured on the AVX2-only draws where fp32 decodes, so fp32
    # keeps F.linear (MKL), the path those draws were timed on
    return dtype == torch.bfloat16 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _packed_forward(packed, bias, out_features: int):
    def forward(x):
        flat = x.reshape(-1, x.shape[-1])
        y = torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "")
        return y.view(*x.shape[:-1], out_features)

    return forward


@contextlib.contextmanager
def packed_linears(model, rows: int):
    """While inside: every plain nn.Linear of a CPU `model` (after any LoRA merge and dtype hold)
    runs on a copy of its weight packed for oneDNN, sized for `rows` rows a call; the modules are
    as they were on exit. Yields how many Linears it packed (0 where packing is not available)."""
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.device.type == "cpu"]
    dtypes = {m.weight.dtype for m in linears}
    if not linears or len(dtypes) != 1 or not can_pack(dtypes.pop()):
        yield 0
        return
    packed = {}  # by weight: a tied head shares its packed copy too
    try:
        for m in linears:
            key = id(m.weight)
            if key not in packed:
                packed[key] = torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), rows)
            bias = m.bias.detach() if m.bias is not None else None
            m.forward = _packed_forward(packed[key], bias, m.out_features)
        yield len(linears)
    finally:
        for m in linears:
            m.__dict__.pop("forward", None)
