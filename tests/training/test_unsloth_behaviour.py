"""Under unsloth (gpu-3b-qlora's default loader) the lab's losses and log-probs must not change.

The pinned unsloth 2026.10.9 (unsloth/models/llama.py) does two things to a forward's arguments
that the lab's training passes would otherwise take silently:
- a tensor `logits_to_keep` is replaced by 0 ("Skip int max() if either is a tensor"): the LM head
  gets every position, not the kept columns the lab asked for;
- in train mode the attention mask is dropped (`LlamaModel_fast_forward`: kept only when 2-D,
  left-padded and label-less), a packed row's 4-D block mask included, so its sequences would
  attend to each other.
`_unslothed` wraps a tiny random Llama so that its forward does exactly that, and the lab must
give the plain model's numbers under it (or refuse packing with a clear reason)."""

from __future__ import annotations

import copy

import pytest
import torch

from coa_lab.training import lm_head, packing
from coa_lab.training.logprobs import token_logprobs
from coa_lab.training.sft import IGNORE_INDEX, masked_lm_loss, pack_batch, pad_batch

UNSLOTH_MODULE = "unsloth.models.llama"  # where unsloth's patched forwards are defined


def _tiny():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=60, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).train()


def _unslothed(model):
    """A copy of `model` (same weights) whose forward treats its arguments as unsloth 2026.10.9's."""
    fake = copy.deepcopy(model)
    plain = fake.forward

    def forward(input_ids=None, attention_mask=None, labels=None, logits_to_keep=0, **kwargs):
        if isinstance(logits_to_keep, torch.Tensor):
            logits_to_keep = 0  # CausalLM_fast_forward: every position goes to the head
        left_padded = attention_mask is not None and attention_mask.dim() == 2 and not bool(attention_mask[:, 0].all())
        if fake.training and not (labels is None and left_padded):
            attention_mask = None  # LlamaModel_fast_forward: the mask is ignored in train mode
        return plain(input_ids=input_ids, attention_mask=attention_mask, labels=labels,
                     logits_to_keep=logits_to_keep, **kwargs)

    forward.__module__ = UNSLOTH_MODULE  # as unsloth's own patched forwards are
    fake.forward = forward
    return fake


def _grads(model) -> dict:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same_grads(a, b):
    ga, gb = _grads(a), _grads(b)
    assert ga and set(ga) == set(gb)
    for name in ga:
        torch.testing.assert_close(ga[name], gb[name], atol=1e-5, rtol=1e-4, msg=name)


def _sft_batch():
    """Two examples of different lengths (sft.pad_batch right-pads them), prompt and an observation
    span unlabelled."""
    X = IGNORE_INDEX
    return [{"input_ids": [3, 14, 15, 9, 2, 6, 5, 3, 5, 8, 9], "labels": [X] * 5 + [6, 5, X, X, 8, 9]},
            {"input_ids": [1, 4, 1, 5, 9, 2, 6, 5], "labels": [X] * 3 + [5, 9, 2, 6, 5]}]


SEQS = [[5, 9, 11, 3, 7, 22, 8, 4, 4, 17, 30], [5, 9, 11, 3, 7, 22, 8, 4, 12], [5, 9, 11, 3, 7, 50, 51]]


def _padded_ids(seqs):
    width = max(len(s) for s in seqs)
    ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
    real = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    return ids, real


def test_the_fake_really_changes_a_naive_computation():
    """Negative control: without the lab's guards the wrapper gives other numbers."""
    model = _tiny()
    fake = _unslothed(model)
    ids, real = _padded_ids(SEQS)
    keep = torch.tensor([2, 5, 7])
    assert model(input_ids=ids, attention_mask=real, logits_to_keep=keep).logits.shape[1] == 3
    full = fake(input_ids=ids, attention_mask=real, logits_to_keep=keep).logits
    assert full.shape[1] == ids.shape[1]  # the tensor logits_to_keep was ignored
    want = model(input_ids=ids, attention_mask=real, logits_to_keep=keep).logits
    assert not torch.allclose(full[:, :3], want, atol=1e-3)  # indexing as if kept reads other positions
    # a packed row's 4-D mask is dropped in train mode: its sequences see each other
    inputs = packing.pack([SEQS], 0).model_inputs(model)
    assert not torch.allclose(_unslothed(model)(**inputs).logits, model(**inputs).logits, atol=1e-3)


def test_sft_masked_loss_under_unsloth_equals_plain():
    model = _tiny()
    fake = _unslothed(model)
    batch = pad_batch(_sft_batch(), pad_id=0)
    want = masked_lm_loss(model, batch)
    want.backward()
    got = masked_lm_loss(fake, batch)
    got.backward()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    _assert_same_grads(fake, model)


@pytest.mark.parametrize("unchunked", [False, True])
def test_token_logprobs_under_unsloth_equal_plain(monkeypatch, unchunked):
    """RL's log-prob path, chunked head and the plain (`UNCHUNKED`, sharded-head) branch of nll_at."""
    monkeypatch.setattr(lm_head, "UNCHUNKED", unchunked)
    model = _tiny()
    fake = _unslothed(model)
    ids, real = _padded_ids(SEQS)
    want = token_logprobs(model, ids, real, start=5, temperature=0.8) * real  # padding is never scored
    want.sum().backward()
    got = token_logprobs(fake, ids, real, start=5, temperature=0.8) * real
    got.sum().backward()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    _assert_same_grads(fake, model)


def test_packing_under_unsloth_is_refused_and_falls_back_to_padded_rows():
    from peft import LoraConfig, get_peft_model

    from coa_lab.training.sft import collator

    model = _tiny()
    fake = _unslothed(model)
    assert packing.supported(model) and not packing.supported(fake)
    assert not packing.supported(get_peft_model(_unslothed(model), LoraConfig(r=2, target_modules=["q_proj"])))
    with pytest.raises(ValueError, match="unsloth"):
        packing.pack([SEQS], 0).model_inputs(fake)
    with pytest.raises(ValueError, match="unsloth"):
        packing.sequence_logprobs(fake, SEQS, [[0, 1, 2]], [5, 5, 5], pad_id=0)
    # SFT's collator picks padded rows under unsloth: the loss of the packed batch on the plain model
    rows = _sft_batch()
    batch = collator(fake, 0)(rows)
    assert "packed_index" not in batch
    torch.testing.assert_close(masked_lm_loss(fake, batch), masked_lm_loss(model, pack_batch(rows, 0)),
                               atol=1e-5, rtol=1e-5)
