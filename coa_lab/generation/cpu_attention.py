"""SDPA with native grouped-query attention, for models running on CPU.

SmolLM2-135M has 9 query heads sharing 3 key/value heads. transformers' "sdpa" attention
passes `enable_gqa` to torch only when there is no attention mask (i.e. not for a padded
batch); otherwise it first copies every key and value 3x (`repeat_kv`). In batched
decoding that copy is of the whole KV cache at every step and every layer: measured here,
one 32-row decode step over a 300-token cache spent 9.4 ms per layer in repeat+SDPA and
2.4 ms with `enable_gqa=True` (identical output). Registered under its own name so the
masks are still built the sdpa way; GPU models keep transformers' default.

Registered outside torch.compile's graphs: training compiles each decoder layer
(coa_lab/training/compiled_layers.py), and a packed row's loop over its sequences would compile
once per number of sequences; the attention runs eager between the layer's graphs instead.
"""

from __future__ import annotations

# torch and transformers are imported inside the functions: generation/models.py imports this
# module, and `coa-lab --help` and `coa-lab plan` import that without them
NAME = "coa_sdpa_gqa"


def sdpa_gqa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                       is_causal=None, **kwargs):
    import torch.nn.functional as F

    segments = kwargs.get("packed_segments")
    if segments is not None:  # a packed training row (coa_lab/training/packing.py)
        return segment_attention(query, key, value, segments, scaling), None
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # a single query token attends to the whole cache: no causal triangle to apply
    causal = bool(query.shape[2] > 1 and attention_mask is None and causal)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, is_causal=causal, enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


def use_native_gqa(model) -> bool:
    """Switch a CPU model from "sdpa" to this attention; returns whether it did."""
    import torch
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    if next(model.parameters()).device.type != "cpu":
        return False
    AttentionInterface.register(NAME, torch.compiler.disable(sdpa_gqa_attention))
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    config._attn_implementation = NAME
    return True


def segment_attention(query, key, value, segments, scaling=None):
    """Attention for packed rows, one SDPA call per sequence's own block of columns.

    A packed row's 4D mask is mostly False (a sample never sees its siblings), but a masked
    SDPA still computes every (query, key) pair of the row: for a GRPO group of 4 samples of
    160 tokens under a 140-token prompt, 780^2 pairs where 300 x 300 + 3 x 160 x 300 are
    needed. Here each sequence's own columns attend only its own key columns (its shared prefix
    gathered from wherever another sequence wrote it), causal aligned to the bottom right.

    query: [R, H, T, D]; key, value: [R, Hkv, T, D]; segments[r]: (start, end, key columns,
    bool mask [end-start, len(key columns)]) covering the row's real columns in order.
    Returns [R, T, H, D], zeros on padding columns."""
    import torch
    import torch.nn.functional as F

    gqa = key.shape[1] != query.shape[1]
    rows = []
    for r, row in enumerate(segments):
        parts, end = [], 0
        for start, stop, columns, mask in row:
            q = query[r : r + 1, :, start:stop]
            k, v = key[r : r + 1, :, columns], value[r : r + 1, :, columns]
            parts.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling, enable_gqa=gqa))
            end = stop
        if end < query.shape[2]:  # padding columns of a shorter row
            parts.append(query.new_zeros((1, query.shape[1], query.shape[2] - end, query.shape[3])))
        rows.append(torch.cat(parts, dim=2))
    return torch.cat(rows, dim=0).transpose(1, 2).contiguous()
