"""coa_lab/sft.py: `masked_lm_loss` (LM head only from the first labelled position) must equal
transformers' own causal-LM loss over the same labels, in value and in gradient."""

from __future__ import annotations

import pytest
import torch

from coa_lab.sft import IGNORE_INDEX, masked_lm_loss


@pytest.fixture()
def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=60, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1)
    return LlamaForCausalLM(cfg)


def _batch(prompt_lens=(5, 3), lengths=(11, 8), width=11):
    torch.manual_seed(1)
    ids = torch.randint(0, 60, (len(lengths), width))
    labels = ids.clone()
    attn = torch.ones_like(ids)
    for b, (p, n) in enumerate(zip(prompt_lens, lengths)):
        labels[b, :p] = IGNORE_INDEX  # prompt
        labels[b, n:] = IGNORE_INDEX  # padding
        attn[b, n:] = 0
    labels[0, 7:9] = IGNORE_INDEX  # an observation span inside the trajectory
    return {"input_ids": ids, "attention_mask": attn, "labels": labels}


def _grads(model):
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_masked_loss_equals_transformers_loss_and_gradients(tiny_llama):
    batch = _batch()
    want = tiny_llama(**batch).loss
    want.backward()
    want_grads = _grads(tiny_llama)
    tiny_llama.zero_grad(set_to_none=True)
    got = masked_lm_loss(tiny_llama, batch)
    got.backward()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for g, w in zip(_grads(tiny_llama), want_grads):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_num_items_in_batch_divides_the_sum(tiny_llama):
    """Gradient accumulation: the Trainer passes the label count of all micro-batches."""
    batch = _batch()
    with torch.no_grad():
        mean = masked_lm_loss(tiny_llama, batch)
        n = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
        summed = masked_lm_loss(tiny_llama, batch, num_items_in_batch=2 * n)
    torch.testing.assert_close(summed, mean / 2)


def test_batch_without_labels_gives_zero_loss(tiny_llama):
    batch = _batch()
    batch["labels"][:] = IGNORE_INDEX
    with torch.no_grad():
        assert float(masked_lm_loss(tiny_llama, batch)) == 0.0
