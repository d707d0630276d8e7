"""coa_lab/training/sft.py: `masked_lm_loss` (LM head only from the first labelled position) must equal
transformers' own causal-LM loss over the same labels, in value and in gradient."""

from __future__ import annotations

import pytest
import torch

from coa_lab.training.sft import IGNORE_INDEX, masked_lm_loss


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


# ---------------------------------------------------------------- packed batches (sft.pack_batch)


def _rows():
    """Three examples: two share a 6-token prompt prefix, one has an observation span."""
    from coa_lab.training.sft import IGNORE_INDEX as X

    prefix = [3, 14, 15, 9, 2, 6]
    return [
        {"input_ids": prefix + [5, 3, 5, 8, 9, 7, 9], "labels": [X] * 8 + [5, 8, X, 7, 9]},
        {"input_ids": prefix + [23, 38, 46, 26], "labels": [X] * 7 + [38, 46, 26]},
        {"input_ids": [1, 4, 1, 5, 9, 2, 6, 5, 3], "labels": [X] * 4 + [9, 2, 6, 5, 3]},
    ]


@pytest.mark.parametrize("attn", ["sdpa", "eager", "gqa"])
def test_packed_loss_equals_padded_loss_and_gradients(attn):
    """The speed path must not change what is learned: same loss, same gradients."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from coa_lab.training.sft import pack_batch, pad_batch

    torch.manual_seed(0)
    from coa_lab.generation.cpu_attention import use_native_gqa

    model = LlamaForCausalLM(LlamaConfig(vocab_size=60, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1,
                                         attn_implementation="eager" if attn == "eager" else "sdpa"))
    if attn == "gqa":  # the lab's CPU attention: the packed row runs block by block
        assert use_native_gqa(model)
    rows = _rows()
    want = masked_lm_loss(model, pad_batch(rows, 0))
    want.backward()
    want_grads = _grads(model)
    model.zero_grad(set_to_none=True)
    packed = pack_batch(rows, 0)
    assert packed["input_ids"].shape == (1, 13 + 4 + 9)  # the shared prefix once, no padding
    got = masked_lm_loss(model, packed)
    got.backward()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for g, w in zip(_grads(model), want_grads):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)
    with torch.no_grad():  # the Trainer's label count is the same for both layouts
        torch.testing.assert_close(masked_lm_loss(model, packed, num_items_in_batch=30), want.detach() * 12 / 30)


def test_packed_batch_without_labels_gives_zero_loss(tiny_llama):
    from coa_lab.training.sft import pack_batch

    rows = [{**r, "labels": [IGNORE_INDEX] * len(r["labels"])} for r in _rows()]
    loss = masked_lm_loss(tiny_llama, pack_batch(rows, 0))
    assert float(loss.detach()) == 0.0
    loss.backward()  # an all-masked batch still steps without error


def test_collator_falls_back_to_padding_without_4d_masks(tiny_llama):
    from coa_lab.training.sft import collator

    assert "packed_index" in collator(tiny_llama, 0)(_rows())
    tiny_llama.config._attn_implementation = "flash_attention_2"
    assert "attention_mask" in collator(tiny_llama, 0)(_rows())
