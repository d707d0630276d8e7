"""The decoder under autocast: frozen weights held in the autocast dtype while it decodes
(coa_lab.generation.decode_numerics.frozen_linears_in_autocast_dtype) change no token and no log-prob."""

from __future__ import annotations

import contextlib

import pytest
import torch

from coa_lab.generation import decode_numerics
from coa_lab.generation.hf_generator import HFGenerator


@pytest.fixture(scope="module")
def tiny_lora_and_tokenizer():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from coa_lab.config import ModelConfig
    from coa_lab.generation.models import load_tokenizer

    tok = load_tokenizer(ModelConfig().name)  # the embedded model's tokenizer (offline)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"]))
    for p in model.parameters():  # a trained policy's adapter, not LoRA's zero start
        if p.requires_grad:
            p.data.normal_(0, 0.2)
    return model, tok


def _bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def _sampled(model, tok, monkeypatch, hold: bool):
    if not hold:  # the decoder as it was: autocast re-casts every frozen weight at every step
        monkeypatch.setattr(decode_numerics, "frozen_linears_in_autocast_dtype", lambda m: contextlib.nullcontext(0))
    prompts = [tok.encode(q) for q in ("What is 2 + 2?", "Who directed the film The Imp?", "Hello")]
    torch.manual_seed(1)
    gens = HFGenerator(model, tok, batch_size=3, compute=_bf16).generate(prompts, max_new_tokens=12, temperature=0.8)
    monkeypatch.undo()
    return [(g.token_ids, g.logprobs) for g in gens]


def test_holding_frozen_weights_in_bf16_changes_no_token_or_logprob(tiny_lora_and_tokenizer, monkeypatch):
    model, tok = tiny_lora_and_tokenizer
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    held = _sampled(model, tok, monkeypatch, hold=True)
    base = model.base_model.model
    assert base.lm_head.weight is base.model.embed_tokens.weight  # the tied head is tied again
    assert held == _sampled(model, tok, monkeypatch, hold=False)  # bit-identical, sampled at T = 0.8
    for n, p in model.named_parameters():  # every weight back in fp32 after the decode
        assert p.dtype == torch.float32, n
        # merged with LoRA, then restored (generation/lora_merge), or held in bf16 (or untouched):
        # either way the very fp32 values are back
        assert torch.equal(p, before[n]), n


def test_only_frozen_non_lora_linears_are_held_and_a_tied_head_gets_its_own_copy(tiny_lora_and_tokenizer):
    model, _ = tiny_lora_and_tokenizer
    base = model.base_model.model
    with decode_numerics.frozen_linears_in_autocast_dtype(model) as n:
        assert n == 0  # no autocast, nothing to do
    with _bf16(), decode_numerics.frozen_linears_in_autocast_dtype(model) as n:
        assert n == 2 * 7 + 1  # q, k, v, o, gate, up, down in each of the 2 layers, and the tied lm_head
        assert base.model.layers[0].self_attn.q_proj.base_layer.weight.dtype == torch.bfloat16
        assert base.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
        assert base.lm_head.weight.dtype == torch.bfloat16 and base.model.embed_tokens.weight.dtype == torch.float32
        assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)  # LoRA's, trainable
    assert base.model.layers[0].mlp.up_proj.weight.dtype == torch.float32
