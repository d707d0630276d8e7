"""Per-token log-probs of a sequence under a model: what RL's ratio, its KL term and the
sampler/trainer consistency checks all score (packing.sequence_logprobs is the packed twin)."""

from __future__ import annotations

import torch

from coa_lab.training.lm_head import check_temperature, nll_at


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, start: int = 1,
                   temperature: float = 1.0) -> torch.Tensor:
    """log p(token_t | tokens_<t) for every position t >= start; positions < start get 0.

    temperature: the SAMPLING temperature. The rollouts were drawn from softmax(logits / T), so
    the ratio and the gradient must be taken of that policy too (verl divides the same way);
    scoring at T = 1 what was sampled at T = 0.8 optimises another policy than the one sampled.

    input_ids, attention_mask: [B, L] (right-padded) -> [B, L].
    start: the first position whose log-prob is needed (the shortest prompt's length: no
    prompt token is ever in the loss). The LM head then runs only on positions start-1..L-2,
    and chunk by chunk (coa_lab/training/lm_head.py): [B, L, V] logits would be the largest tensor of
    the step, 4.6 GiB per 8k-token row at Qwen2.5's vocabulary.
    """
    batch, length = input_ids.shape
    start = max(1, min(int(start), length))
    temperature = check_temperature(temperature)
    # position t-1 predicts token t, for t = start..L-1 of every row; the LM head runs there
    # only, a chunk of positions at a time (coa_lab/training/lm_head.py: no [B, L, V] logits tensor)
    columns = torch.arange(start - 1, length - 1, device=input_ids.device)
    rows = torch.arange(batch, device=input_ids.device).repeat_interleave(len(columns))
    nll = nll_at(model, {"input_ids": input_ids, "attention_mask": attention_mask}, rows, columns.repeat(batch),
                 input_ids[:, start:].reshape(-1), temperature)
    return torch.nn.functional.pad(-nll.view(batch, length - start), (start, 0))  # [B, L], on the graph even when empty
