"""Shared-prefix packing: several sequences in one row, every shared prefix computed once.

The samples of one GRPO group share their whole prompt (~140 of ~300 tokens in the demo);
two SFT examples of one profile share their system instruction (~105 tokens). Padded to one
row each, those prefix tokens are computed once per sequence, forward AND backward. Packed,
a row is a prefix tree: each sequence reuses the positions of the longest common prefix it
has with a sequence already in the row and appends only its own tokens. A 4D attention mask
lets a token see exactly the earlier tokens of its own sequence, and position ids count
along each sequence, so every sequence gets the hidden states of its own padded forward
(tests/training/test_packing.py checks values and gradients). No padding is computed either.

    row:   [ system + question | answer A ........ | answer B ...... ]
    mask:  answer B's tokens see the prompt and answer B, never answer A

Only attention implementations that take an arbitrary 4D mask can do this (sdpa, eager, and
the lab's CPU sdpa in coa_lab/generation/cpu_attention.py); `supported(model)` says whether a model's
does, and the callers fall back to padded batches where it does not (flash-attention). Nor does
a model under unsloth (gpu-3b-qlora's default): the pinned 2026.10.9 drops the attention mask in
train mode (models/llama.py keeps only a left-padded 2-D one), so packed sequences would attend
to each other, silently. Its right-padded rows need no mask (causal attention never reaches the
trailing pads), so unsloth gets padded batches and `model_inputs` refuses it a packed one. A
masked attention still computes every (query, key) pair of the row, so on CPU the lab's
attention takes the row's `segments` instead and runs each sequence's own block against its
own keys only (`cpu_attention.segment_attention`).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch

from coa_lab.generation.cpu_attention import NAME as CPU_SDPA
from coa_lab.generation.decoding import common_prefix
from coa_lab.training.lm_head import check_temperature, nll_at

_MASK_KINDS = {"sdpa": "bool", CPU_SDPA: "bool", "eager": "additive"}
UNSLOTH_REFUSAL = ("packed rows need their 4D attention mask, which unsloth drops in train mode (the "
                   "sequences would attend to each other): use padded batches")
log = logging.getLogger(__name__)


def _attention_of(model) -> str | None:
    """The attention implementation, through a DDP wrapper (`.module`) if there is one."""
    return getattr(getattr(model, "module", model).config, "_attn_implementation", None)


def under_unsloth(model) -> bool:
    """Whether unsloth has patched the model. Its FastLanguageModel replaces the forward of the
    model's classes (PEFT's included) with functions of its own modules (unsloth.models.*, or its
    compiled cache unsloth_compiled_cache), so a forward from there gives it away, through PEFT,
    DDP or any other wrapper, whatever the attention implementation says."""
    for module in model.modules() if hasattr(model, "modules") else [model]:
        for forward in (getattr(type(module), "forward", None), getattr(module, "forward", None)):
            if (getattr(forward, "__module__", None) or "").startswith("unsloth"):
                return True
    return False


@functools.cache
def _warn_unsloth():
    log.warning("unsloth model: padded rows, not packed ones (it drops their 4D mask in train mode)")


def supported(model) -> bool:
    """Whether the model's attention takes the packed 4D mask: not under unsloth (module docstring),
    whose callers then use padded rows, with a one-time warning."""
    if under_unsloth(model):
        _warn_unsloth()
        return False
    return _attention_of(model) in _MASK_KINDS


@dataclass
class Packed:
    """Rows of packed sequences.

    input_ids, position_ids: [R, T]; allowed: [R, T, T] bool, query row -> key column;
    row_of[i]: the row of sequence i; index[i]: [len_i] the packed column of each of its
    tokens (a shared prefix points at columns another sequence wrote); pad_columns: columns
    that only pad a row to the batch's width.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    allowed: torch.Tensor
    row_of: list[int]
    index: list[torch.Tensor]
    pad_columns: int = 0

    @property
    def tokens(self) -> int:
        """Columns holding a real token: what the forward computes, padding excluded."""
        return self.input_ids.numel() - self.pad_columns

    def model_inputs(self, model) -> dict:
        """Keyword arguments for the model's forward (no cache: this is a training pass)."""
        return model_inputs(model, self.input_ids, self.position_ids, self.allowed,
                            segments(self.index, self.row_of, len(self.input_ids)))


def segments(index: list[torch.Tensor], row_of: list[int], n_rows: int) -> list[list[tuple]]:
    """Per row, each sequence's own block of columns with the key columns it attends:
    (start, end, key columns, bool mask [end-start, n keys], causal aligned bottom-right).
    What `cpu_attention.segment_attention` computes instead of the row's whole mask."""
    out: list[list[tuple]] = [[] for _ in range(n_rows)]
    laid = [0] * n_rows  # columns written so far in each row
    for cols, r in zip(index, row_of):
        share = int((cols < laid[r]).sum())  # the prefix another sequence wrote
        own = len(cols) - share
        if own:
            mask = torch.ones(own, len(cols), dtype=torch.bool).tril(diagonal=share)
            out[r].append((laid[r], laid[r] + own, cols, mask))
            laid[r] += own
    return out


def model_inputs(model, input_ids, position_ids, allowed, segs: list | None = None) -> dict:
    """The forward's keyword arguments for packed rows, the mask in the form the model's
    attention takes (bool for sdpa, additive for eager). With `segs` and the lab's CPU
    attention, attention runs block by block (`cpu_attention.segment_attention`)."""
    if under_unsloth(model):
        raise ValueError(UNSLOTH_REFUSAL)
    kind = _MASK_KINDS.get(_attention_of(model))
    if kind is None:
        raise ValueError("this model's attention implementation takes no 4D mask: use padded batches")
    mask = allowed.unsqueeze(1)  # [R, 1, T, T], broadcast over heads
    if kind == "additive":  # eager attention adds the mask to the scores
        dtype = next(model.parameters()).dtype
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    device = next(model.parameters()).device
    inputs = {"input_ids": input_ids.to(device), "position_ids": position_ids.to(device),
              "attention_mask": mask.to(device), "use_cache": False}
    if segs is not None and _attention_of(model) == CPU_SDPA:
        inputs["packed_segments"] = segs
    return inputs


def pack(rows: list[list[list[int]]], pad_id: int) -> Packed:
    """Lay out `rows[r]` (a list of token sequences) in packed row r, sharing prefixes.

    Sequence order is row by row; `Packed.index` follows it."""
    if not rows or any(not row for row in rows):
        raise ValueError("pack needs at least one sequence per row")
    layouts, row_of, index = [], [], []
    for r, seqs in enumerate(rows):
        cols: list[int] = []  # token id of each packed column
        pos: list[int] = []  # its position within its sequence
        keys: list[tuple[list[int], int]] = []  # per new column: (its sequence's columns, its offset)
        placed: list[tuple[list[int], list[int]]] = []  # (tokens, columns) of the sequences already in the row
        for seq in seqs:
            if not seq:
                raise ValueError("pack got an empty sequence")
            share, parent = 0, None
            for tokens, columns in placed:
                c = common_prefix(seq, tokens)
                if c > share:
                    share, parent = c, columns
            mine = list(parent[:share]) if parent else []
            for t in range(share, len(seq)):
                mine.append(len(cols))
                cols.append(seq[t])
                pos.append(t)
            for t in range(share, len(seq)):
                keys.append((mine, t))
            placed.append((seq, mine))
            row_of.append(r)
            index.append(torch.tensor(mine))
        layouts.append((cols, pos, keys))
    width = max(len(cols) for cols, _, _ in layouts)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(rows), width), dtype=torch.long)
    allowed = torch.zeros((len(rows), width, width), dtype=torch.bool)
    pad_columns = 0
    for r, (cols, pos, keys) in enumerate(layouts):
        n = len(cols)
        input_ids[r, :n] = torch.tensor(cols)
        position_ids[r, :n] = torch.tensor(pos)
        for q, (mine, t) in enumerate(keys):  # column q is token t of a sequence laid at `mine`
            allowed[r, q, mine[: t + 1]] = True
        # padding columns attend to themselves only: a row of all False would give NaN in softmax
        allowed[r, range(n, width), range(n, width)] = True
        pad_columns += width - n
    return Packed(input_ids, position_ids, allowed, row_of, index, pad_columns=pad_columns)


def sequence_logprobs(model, sequences: list[list[int]], rows: list[list[int]], starts: list[int],
                      pad_id: int, width: int | None = None, temperature: float = 1.0) -> torch.Tensor:
    """log p(token_t | tokens_<t) of each sequence for t >= starts[i], 0 elsewhere: [N, width].
    temperature: the sampling temperature (logits are divided by it, as in logprobs.token_logprobs).

    The packed twin of `logprobs.token_logprobs` (same layout: sequence i right-padded to
    `width`, default the longest). `rows` groups sequence indices into packed rows (the GRPO
    trainer packs each group's samples, which share their prompt)."""
    order = [i for row in rows for i in row]
    packed = pack([[sequences[i] for i in row] for row in rows], pad_id)
    src_rows, src_cols, targets, spans = [], [], [], []
    for k, i in enumerate(order):
        s = min(max(1, starts[i]), len(sequences[i]))
        cols = packed.index[k][s - 1 : len(sequences[i]) - 1]  # position t-1 predicts token t
        src_rows.append(torch.full_like(cols, packed.row_of[k]))
        src_cols.append(cols)
        targets += sequences[i][s:]
        spans.append((i, s, len(cols)))
    if not targets:  # every sequence ends at its start: nothing to score
        return torch.zeros((len(sequences), width or max(len(s) for s in sequences)))

    # the sampled policy's distribution, softmax(logits / T), the LM head a chunk at a time
    nll = nll_at(model, packed.model_inputs(model), torch.cat(src_rows), torch.cat(src_cols),
                 torch.tensor(targets), check_temperature(temperature))
    out = torch.zeros((len(sequences), width or max(len(s) for s in sequences)), device=nll.device)
    at = 0
    for i, s, n in spans:
        out[i, s : s + n] = -nll[at : at + n]
        at += n
    return out
