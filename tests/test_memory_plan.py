"""coa_lab/memory_plan.py against hand-computed values and against the real model's counts."""

import pytest

from coa_lab.config import get_preset
from coa_lab.memory_plan import GIB, ModelShape, lora_params, plan, qwen2_biases, shape_of

TOY = ModelShape(hidden=8, layers=2, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=10, tied=True)


def test_toy_param_count_by_hand():
    # per layer: q 8x8=64, k 8x4=32, v 32, o 64, gate 8x16=128, up 128, down 128 -> 576
    assert TOY.layer_linear_params() == 576
    # embeddings 10x8 (tied), 2 layers, norms 2x2x8 + 8
    assert TOY.params() == 80 + 2 * 576 + 40
    untied = ModelShape(**{**TOY.__dict__, "tied": False})
    assert untied.params() == TOY.params() + 80


def test_toy_lora_params_by_hand():
    # r=2 on q (8+8) and down (16+8), 2 layers
    assert lora_params(TOY, 2, ("q_proj", "down_proj")) == 2 * 2 * (16 + 24)


def test_published_sizes_of_the_presets_models():
    q3 = shape_of("Qwen/Qwen2.5-3B-Instruct")
    q32 = shape_of("Qwen/Qwen2.5-32B-Instruct")
    assert q3.params(qwen2_biases(q3)) == pytest.approx(3.09e9, rel=0.005)  # model card: 3.09B
    assert q32.params(qwen2_biases(q32)) == pytest.approx(32.8e9, rel=0.005)  # model card: 32.5B..32.8B


def test_unknown_model_is_a_clear_error():
    with pytest.raises(ValueError, match="no shape known"):
        shape_of("someone/unknown-model")
    with pytest.raises(ValueError, match="gpus"):
        plan(get_preset("cpu-tiny"), gpus=0)


@pytest.mark.model
def test_embedded_shape_matches_the_real_model_and_its_lora():
    from coa_lab.models import load_model

    preset = get_preset("cpu-tiny")
    shape = shape_of(preset.model.name)
    model, _ = load_model(preset.model, trainable=True)
    assert shape.params() == sum(p.numel() for p in model.parameters() if not p.requires_grad)  # the frozen base
    assert lora_params(shape, preset.model.lora_r, preset.model.target_modules) == sum(
        p.numel() for p in model.parameters() if p.requires_grad)


def test_cpu_tiny_plan_by_hand():
    preset = get_preset("cpu-tiny")
    p = plan(preset, shape=TOY)
    n, t = TOY.params(), lora_params(TOY, preset.model.lora_r, preset.model.target_modules)
    assert p.weights_gib * GIB == n * 4  # fp32
    assert p.gradients_gib * GIB == t * 4 and p.optimizer_gib * GIB == t * 8
    b, s = preset.sft.batch_size, preset.sft.max_length
    assert p.activations_gib * GIB == 2 * 34 * s * b * 8  # no checkpointing in cpu-tiny
    assert p.logits_gib * GIB == b * s * 10 * (4 + 4)  # fp32 logits and their gradient
    per_token = 2 * 2 * 1 * 4 * 2  # K and V, 2 layers, 1 kv head of 4, 2 bytes
    assert p.kv_cache_gib * GIB == per_token * preset.gen.batch_size * (preset.gen.max_response_tokens + 512)


def test_sharding_divides_what_zero_shards():
    full = get_preset("multinode-32b")
    one, eight = plan(full, 1), plan(full, 8)
    assert eight.weights_gib == pytest.approx(one.weights_gib / 8)  # ZeRO-3: weights too
    assert eight.optimizer_gib == pytest.approx(one.optimizer_gib / 8)
    assert eight.activations_gib == one.activations_gib and eight.logits_gib == one.logits_gib
    lora = get_preset("gpu-3b-qlora")
    a, b = plan(lora, 1), plan(lora, 4)
    assert b.weights_gib == a.weights_gib  # the frozen base is replicated
    assert b.optimizer_gib == pytest.approx(a.optimizer_gib / 4)


def test_checkpointing_and_4bit_shrink_what_they_should():
    preset = get_preset("gpu-3b-qlora")
    p = plan(preset)
    assert p.activations_gib == p.activations_ckpt_gib < p.activations_no_ckpt_gib / 10
    shape = shape_of(preset.model.name)
    linear = shape.layers * shape.layer_linear_params()
    assert p.weights_gib * GIB == linear * 0.5 + (p.params - linear) * 2
