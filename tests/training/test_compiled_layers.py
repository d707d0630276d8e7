"""coa_lab/training/compiled_layers.py: training through torch.compile'd decoder layers is the same
training (exactly, in fp32), closer to fp32 than eager bf16 autocast, and only inside its block."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from coa_lab.config import ModelConfig, get_preset
from coa_lab.planning.shrunk import smoke_counts
from coa_lab.training import compiled_layers as cl
from coa_lab.training.sft import IGNORE_INDEX, masked_lm_loss

COMPILE = ModelConfig(cpu_compile=True, cpu_autocast_bf16=False)  # fp32: the compiled step must be exact
needs_compiler = pytest.mark.skipif(not cl.compiler_found(), reason="no C++ compiler for inductor")


def _tiny_lora(seed: int = 0):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj",
                                                                                                  "gate_proj", "down_proj"]))
    for name, p in model.named_parameters():  # LoRA's B starts at zero: move it, so the adapter acts from step 1
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    return model


def _batches(n: int, width: int = 12):
    gen = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        ids = torch.randint(0, 64, (2, width - i), generator=gen)
        labels = ids.clone()
        labels[:, :4] = IGNORE_INDEX  # the prompt
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
    return out


def _train(model, batches, cfg, lr: float = 1e-2) -> list[float]:
    """Optimizer steps on `batches` in cfg's numeric mode, through compiled layers where cfg says; the losses."""
    from coa_lab.generation.models import compute_context

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    model.train()
    with cl.compiled_layers(model, cfg):
        for batch in batches:
            with compute_context(model, cfg):
                loss = masked_lm_loss(model, batch)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    return losses


def test_finds_the_decoder_layers():
    model = _tiny_lora()
    layers = cl.decoder_layers(model)
    assert len(layers) == 2 and all(type(m).__name__ == "LlamaDecoderLayer" for m in layers)
    assert cl.decoder_layers(torch.nn.Sequential(torch.nn.Linear(2, 2))) == []


@needs_compiler
def test_fp32_training_through_compiled_layers_is_eager_training():
    """Three optimizer steps, shapes changing every step (dynamic shapes, no recompile per length):
    the same losses and the same adapter as eager, in fp32."""
    eager, compiled = _tiny_lora(), _tiny_lora()
    batches = _batches(3)
    want = _train(eager, batches, dataclasses.replace(COMPILE, cpu_compile=False))
    got = _train(compiled, batches, COMPILE)
    assert got == pytest.approx(want, rel=1e-5)
    for (name, a), (_, b) in zip(eager.named_parameters(), compiled.named_parameters()):
        if a.requires_grad:
            torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4, msg=name)


@needs_compiler
def test_compiled_only_inside_the_block_and_compiled_once():
    model = _tiny_lora()
    keys = list(model.state_dict())
    with cl.compiled_layers(model, COMPILE) as on:
        assert on
        layers = cl.decoder_layers(model)
        assert all(layer._compiled_call_impl is not None for layer in layers)
        first = [layer._coa_compiled for layer in layers]
    assert all(layer._compiled_call_impl is None for layer in layers)  # the decoder runs eager again
    assert list(model.state_dict()) == keys  # an adapter saves under the same names
    with cl.compiled_layers(model, COMPILE):
        assert [layer._coa_compiled for layer in layers] == first  # every RL step: nothing compiled anew


def test_off_switch_and_no_compiler(monkeypatch, caplog):
    model = _tiny_lora()
    with cl.compiled_layers(model, dataclasses.replace(COMPILE, cpu_compile=False)) as on:
        assert not on and all(layer._compiled_call_impl is None for layer in cl.decoder_layers(model))
    monkeypatch.setattr(cl, "compiler_found", lambda: False)
    monkeypatch.setattr(cl, "_warned", set())
    with caplog.at_level(logging.WARNING, logger=cl.__name__):
        for _ in range(2):
            with cl.compiled_layers(model, COMPILE) as on:
                assert not on
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "C++ compiler" in said[0] and "model.cpu_compile=false" in said[0]


def test_smoke_runs_do_not_compile():
    """Compiling takes longer than a smoke stage trains; the recipe's presets compile."""
    assert get_preset("cpu-tiny").model.cpu_compile and get_preset("cpu-quick").model.cpu_compile
    assert not get_preset("cpu-smoke").model.cpu_compile
    assert not smoke_counts(get_preset("cpu-tiny")).model.cpu_compile


@pytest.mark.model
@needs_compiler
def test_bf16_compiled_training_stays_closer_to_fp32_than_eager_autocast():
    """Eager autocast's losses lag fp32's (it rounds each LoRA layer's output, base + the adapter's small
    delta, to bf16: the likeliest reason); the fused layer keeps fp32 inside. Four SFT steps of the embedded model on shipped trajectories, from one initialisation: the compiled bf16
    run's losses sit nearer fp32's than eager bf16's (benchmarks/bench_compile.py)."""
    from coa_lab.generation.models import cpu_bf16_is_fast, load_model
    from coa_lab.distill.importers import load_imported
    from coa_lab.paths import DATASETS_DIR
    from coa_lab.training.sft import collator, encode_example, record_messages

    if not cpu_bf16_is_fast():
        pytest.skip("this CPU has no bf16 units: training runs fp32 (exact, above)")
    preset = get_preset("cpu-tiny")
    torch.manual_seed(0)
    model, tok = load_model(preset.model, trainable=True)
    records = [t.to_record() for t in load_imported(DATASETS_DIR / "trajectories" / "fireact_hotpotqa_react.jsonl")][:8]
    rows = [encode_example(tok, record_messages(r), r.text, 384) for r in records]
    for r in rows:
        r.pop("n_observation_tokens")
    build = collator(model, tok.pad_token_id)
    batches = [build(rows[i:i + 2]) for i in range(0, 8, 2)]
    start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    def run(bf16: bool, compiled: bool) -> list[float]:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in start:
                    p.copy_(start[n])
        cfg = dataclasses.replace(preset.model, cpu_autocast_bf16=bf16, cpu_compile=compiled)
        return _train(model, batches, cfg, preset.sft.learning_rate)

    fp32, eager, compiled = run(False, False), run(True, False), run(True, True)

    def gap(xs):
        return sum(abs(x - y) for x, y in zip(xs[1:], fp32[1:]))  # after the first update

    assert gap(compiled) < gap(eager), (fp32, eager, compiled)


@needs_compiler
def test_a_failed_compile_says_how_to_train_without_it():
    model = _tiny_lora()
    failure = torch._dynamo.exc.BackendCompilerFailed(lambda *a: None, OSError("cc1plus: not found"), None)
    with pytest.raises(RuntimeError, match="model.cpu_compile=false") as caught:
        with cl.compiled_layers(model, COMPILE):
            raise failure
    assert caught.value.__cause__ is failure
    assert all(layer._compiled_call_impl is None for layer in cl.decoder_layers(model))  # eager again after
