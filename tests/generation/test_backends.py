"""coa_lab/generation/backends.py: gen.backend "auto" and the rollout batch from a KV budget,
the same rows in the decoder and in the planner."""

from __future__ import annotations

import dataclasses

import pytest

from coa_lab.config import GenerationConfig, get_preset
from coa_lab.generation.backends import PROMPT_TOKENS, resolve_backend, rollout_batch, rows_for_budget

GIB = 1024**3


def test_auto_is_the_labs_decoder_without_vllm_and_other_names_pass_through(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert resolve_backend("auto") == "hf"
    for name in ("hf", "vllm", "vllm-server"):
        assert resolve_backend(name) == name


def test_auto_takes_vllm_only_with_a_gpu(monkeypatch):
    import importlib.util

    import torch

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # "vllm is installed"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_backend("auto") == "hf"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_backend("auto") == "vllm"


def test_rows_for_budget_is_what_fits_capped_by_batch_size():
    gen = GenerationConfig(batch_size=64)
    assert rows_for_budget(gen, 10**9) == 64  # no budget: batch_size
    gen = dataclasses.replace(gen, kv_budget_gib=1.0)
    assert rows_for_budget(gen, GIB // 10) == 10  # 1 GiB holds 10 rows of a tenth of a GiB
    assert rows_for_budget(gen, GIB // 1000) == 64  # room for 1000: capped at batch_size
    assert rows_for_budget(gen, 5 * GIB) == 1  # a row larger than the budget still decodes, alone
    with pytest.raises(ValueError, match="kv_budget_gib"):
        rows_for_budget(dataclasses.replace(gen, kv_budget_gib=0.0), 1)


def test_rollout_batch_reads_the_models_kv_shape():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                         num_attention_heads=4, num_key_value_heads=2))
    gen = GenerationConfig(batch_size=1000, max_response_tokens=488, kv_budget_gib=0.01)
    per_row = 2 * 3 * 2 * 8 * 4 * (PROMPT_TOKENS + 488)  # K and V x layers x kv heads x head_dim x fp32 x tokens
    assert rollout_batch(gen, model) == int(0.01 * GIB // per_row)
    model.to(torch.bfloat16)  # a 16-bit cache holds twice the rows
    assert rollout_batch(gen, model) == int(0.01 * GIB // (per_row // 2))
    assert rollout_batch(dataclasses.replace(gen, kv_budget_gib=None), model) == 1000


def test_the_planner_sizes_the_rollout_batch_from_the_same_budget():
    from coa_lab.generation.engine_share import kv_bytes_per_token
    from coa_lab.generation.model_shape import shape_of
    from coa_lab.planning.memory_plan import plan

    preset = get_preset("gpu-3b-qlora")
    shape = shape_of(preset.model.name)
    per_row = kv_bytes_per_token(shape) * (PROMPT_TOKENS + preset.gen.max_response_tokens)
    p = plan(preset, 1)
    assert preset.gen.kv_budget_gib is not None
    assert p.rollout_batch == rows_for_budget(preset.gen, per_row) < preset.gen.batch_size
    assert p.kv_cache_gib == pytest.approx(p.rollout_batch * per_row / GIB)
    assert p.kv_cache_gib <= preset.gen.kv_budget_gib


def test_make_generator_auto_on_a_cpu_is_the_hf_decoder_with_the_budgeted_batch():
    from coa_lab.generation.hf_generator import HFGenerator
    from coa_lab.generation.llm import make_generator

    preset = get_preset("cpu-smoke", gen={"backend": "auto", "kv_budget_gib": 0.05, "batch_size": 512})
    gen = make_generator(preset)
    assert isinstance(gen, HFGenerator)
    assert 1 <= gen.batch_size == rollout_batch(preset.gen, gen.model) < 512
