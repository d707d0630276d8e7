"""One card holds the plan (issue 56): the pipeline frees the GPU of capture's vLLM engine before a
stage trains and makes RL's engine at the planned share; the planner prices the weights that engine
really loads (16-bit unless vLLM is given a quantization); and the one-GPU preset fits its L4 with
the planner's margin. vLLM is not installed on the CPU: a stand-in LLM records what is made and when."""

from __future__ import annotations

import sys
import types

import pytest

from coa_lab import pipeline
from coa_lab.config import get_preset
from coa_lab.generation import vllm_engine
from coa_lab.planning.memory_plan import (GIB, MEMORY_MARGIN, engine_weight_bytes, params_of, plan, rl_on_one_card,
                                          shape_of, weight_bytes)

EVENTS: list = []


class _LLM:
    """vLLM's LLM as the engine factory sees it: made with its share of the GPU, shut down once."""

    def __init__(self, **kwargs):
        self.share = kwargs.get("gpu_memory_utilization")
        EVENTS.append(("engine made", self.share))

    def shutdown(self):
        EVENTS.append(("engine shut down", self.share))


def _live_engine() -> bool:
    return vllm_engine._ENGINE["llm"] is not None


@pytest.fixture
def stand_ins(monkeypatch, tmp_path):
    """Every stage's heavy work replaced by a recorder; generators go through the real make_generator
    and engine_for to a stand-in vLLM on a 24 GiB card."""
    import torch

    from coa_lab.capture import recorder
    from coa_lab.capture.recorder import CaptureResult
    from coa_lab.generation import backends, llm, models
    from coa_lab.rl import pool, trainer
    from coa_lab.rl.pool import PoolReport
    from coa_lab.training import sft

    vllm = types.ModuleType("vllm")
    vllm.LLM = _LLM
    lora = types.ModuleType("vllm.lora.request")
    lora.LoRARequest = lambda name, lora_id, path: (name, lora_id, path)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.lora", types.ModuleType("vllm.lora"))
    monkeypatch.setitem(sys.modules, "vllm.lora.request", lora)
    monkeypatch.setattr(vllm_engine, "require", lambda package, extra: None)
    monkeypatch.setattr(vllm_engine, "_ENGINE", {"key": None, "llm": None})
    monkeypatch.setattr(backends, "resolve_backend", lambda backend: "vllm")
    monkeypatch.setattr(llm, "resolve_backend", lambda backend: "vllm")
    monkeypatch.setattr(models, "resolve_model", lambda name: name)
    monkeypatch.setattr(models, "load_tokenizer", lambda name: types.SimpleNamespace(eos_token_id=2))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(total_memory=24 * GIB))

    def capture_runs(backend, tasks, tools, preset, traces, resume=True):
        EVENTS.append(("capture", backend.engine.share))
        return CaptureResult(runs=[], resumed=0, captured=0, failed=0, dropped_torn_line=False, seconds=0.0)

    def train_sft(preset, records, out, resume=False):
        EVENTS.append(("SFT trains", "engine alive" if _live_engine() else "card free"))
        return types.SimpleNamespace(n_examples=0, losses=[1.0], trained_tokens=0, masked_observation_tokens=0)

    def select_pool(generator, candidates, tools, preset):
        EVENTS.append(("pool screening", generator.engine.share))
        return candidates, PoolReport(len(candidates), 2, len(candidates), {t.id: 0.5 for t in candidates})

    def train_rl(preset, tasks, tools, out, adapter=None, **kwargs):
        EVENTS.append(("RL trains", vllm_engine._ENGINE["llm"].share))
        return types.SimpleNamespace(metrics=[{}])

    monkeypatch.setattr(recorder, "capture_runs", capture_runs)
    monkeypatch.setattr(sft, "train_sft", train_sft)
    monkeypatch.setattr(pool, "select_pool", select_pool)
    monkeypatch.setattr(trainer, "train_rl", train_rl)
    (tmp_path / "distill").mkdir()
    (tmp_path / "distill" / "kept.jsonl").write_text("")
    EVENTS.clear()
    yield tmp_path
    EVENTS.clear()


def _preset():
    """gpu-3b-qlora's model, generation and SFT (what its memory plan reads), with few tasks."""
    return get_preset("gpu-3b-qlora", capture={"tasks": {"math/arith": 2}},
                      rl={"pool": {"math/arith": 4}, "prompts_per_step": 2})


def test_capture_engine_is_released_before_sft_and_rl_makes_its_own_at_the_planned_share(stand_ins):
    preset = _preset()
    share = rl_on_one_card(plan(preset), 24)["vllm_memory_fraction"]
    pipeline.capture(preset, stand_ins, resume=False)
    pipeline.sft(preset, stand_ins)
    pipeline.rl(preset, stand_ins)
    assert EVENTS == [("engine made", share), ("capture", share), ("engine shut down", share),
                      ("SFT trains", "card free"),
                      ("engine made", share), ("pool screening", share), ("RL trains", share)]


def test_rl_right_after_capture_still_gets_a_fresh_engine(stand_ins):
    """No SFT stage in between (a notebook, or `coa-lab rl` after capture in one process): RL frees
    the card itself before its engine and trainer share it."""
    preset = _preset()
    pipeline.capture(preset, stand_ins, resume=False)
    pipeline.rl(preset, stand_ins)
    made = [e for e in EVENTS if e[0] == "engine made"]
    assert [e[0] for e in EVENTS] == ["engine made", "capture", "engine shut down", "engine made",
                                      "pool screening", "RL trains"] and len(made) == 2


# --- the weights the engine loads -------------------------------------------------------------


def test_the_engine_weighs_16_bit_unless_vllm_quantizes():
    """QLoRA's 4-bit flag quantizes the trainer's copy; vLLM, given no quantization, loads the
    checkpoint in the preset's 16-bit dtype: 2 bytes a parameter. Given "bitsandbytes" it would hold
    QLoRA's layout."""
    preset = get_preset("gpu-3b-qlora")
    m, shape = preset.model, shape_of(preset.model.name)
    n = params_of(preset, shape)
    linear = shape.layers * shape.layer_linear_params()
    assert engine_weight_bytes(m, shape, n) == 2 * n  # 5.75 GiB for Qwen2.5-3B
    assert engine_weight_bytes(m, shape, n, "bitsandbytes") == linear * 0.5 + (n - linear) * 2
    assert engine_weight_bytes(m, shape, n, "bitsandbytes") == weight_bytes(m, shape, n)  # the trainer's copy
    assert engine_weight_bytes(m, shape, n) > 3 * engine_weight_bytes(m, shape, n, "bitsandbytes")
    fp32 = get_preset("gpu-3b-qlora", model={"dtype": "float32", "load_in_4bit": False}).model
    assert engine_weight_bytes(fp32, shape, n) == 4 * n  # an fp32 preset's engine computes in fp32
    with pytest.raises(ValueError, match="awq"):
        engine_weight_bytes(m, shape, n, "awq")


def test_the_plan_prices_the_engines_copy_beside_the_trainers():
    """An in-process engine (gen.backend "vllm" or "auto") holds its own 16-bit weights; the lab's
    decoder samples the trainer's 4-bit model and adds no copy."""
    preset = get_preset("gpu-3b-qlora")
    n = params_of(preset, shape_of(preset.model.name))
    for backend in ("auto", "vllm"):
        p = plan(get_preset("gpu-3b-qlora", gen={"backend": backend}))
        assert p.rollout_weights_gib * GIB == 2 * n
        assert p.rollout_total_gib == pytest.approx(p.rollout_weights_gib + p.kv_cache_gib)
    hf = plan(get_preset("gpu-3b-qlora", gen={"backend": "hf"}))
    assert hf.rollout_weights_gib == hf.weights_gib < 2 * n / GIB / 3


# --- the preset fits its card -----------------------------------------------------------------


def test_gpu_3b_qlora_holds_trainer_and_engine_on_one_l4():
    """`coa-lab plan --preset gpu-3b-qlora --gpu L4`: trainer and vLLM together within 24 GiB with
    the planner's margin, and the engine's share is what that plan leaves it."""
    from coa_lab.planning.plan_report import planner_report

    for gpu in ("L4", "A10"):
        report = planner_report(get_preset("gpu-3b-qlora"), gpu=gpu)
        fits, memory = report["fits"], report["memory_gib"]
        assert fits["rl_together"] == fits["train"] == fits["rollout"] == "fits", (gpu, fits)
        assert fits["together_gib"] * MEMORY_MARGIN <= 24
        assert fits["together_gib"] == round(memory["train_total_gib"] + memory["rollout_total_gib"], 2)
        assert fits["vllm_memory_fraction"] == round(memory["rollout_total_gib"] * MEMORY_MARGIN / 24, 2)
        assert report["sampler"] == "vllm-engine"


def test_the_engine_share_on_an_l4_needs_no_warning_and_a_smaller_card_gets_one(monkeypatch):
    """with_engine_share (the pipeline's stages call it): on 24 GiB the pair fits, so no warning; on
    20 GiB it is tight and on 16 it does not fit, and the warning says which."""
    import warnings

    import torch

    from coa_lab.planning.memory_plan import with_engine_share

    def card(gib):
        total = types.SimpleNamespace(total_memory=gib * GIB)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: total)

    card(24)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        filled = with_engine_share(get_preset("gpu-3b-qlora"))
    assert filled.gen.vllm_memory_fraction == rl_on_one_card(plan(filled), 24)["vllm_memory_fraction"] == 0.44
    card(20)
    with pytest.warns(UserWarning, match="is tight on this 20 GiB card"):
        with_engine_share(get_preset("gpu-3b-qlora"))
    card(16)
    with pytest.warns(UserWarning, match="does not fit on this 16 GiB card"):
        with_engine_share(get_preset("gpu-3b-qlora"))
