"""One card holds the plan (issue 56): the pipeline frees the GPU of capture's vLLM engine before a
stage trains and makes RL's engine at the planned share; capture and evaluation, with no trainer on
the card, give their engine the card alone (and the planner prices them at the rows that holds); the
planner prices the weights that engine really loads (16-bit unless vLLM is given a quantization);
and the one-GPU preset fits its L4 with the planner's margin. vLLM is not installed on the CPU: a
stand-in LLM records what is made and when."""

from __future__ import annotations

import sys
import types
import weakref

import pytest

from coa_lab import pipeline
from coa_lab.config import get_preset
from coa_lab.generation import vllm_engine
from coa_lab.generation.engine_share import (ALONE_SHARE_CAP, GIB, MEMORY_MARGIN, engine_alone, engine_weight_bytes,
                                             kv_bytes_per_token, with_engine_alone, with_engine_share)
from coa_lab.generation.model_shape import shape_of
from coa_lab.planning.memory_plan import params_of, plan, rl_fit_warning, rl_on_one_card, weight_bytes

EVENTS: list = []
TRAINERS: weakref.WeakSet = weakref.WeakSet()  # RL's stand-in trainers still alive


class _Trainer:
    """What train_rl holds on the card while it runs: it must be gone before evaluation's engine."""


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

    from coa_lab.capture.recorder import CaptureResult
    from coa_lab.generation import llm
    from coa_lab.rl.pool import PoolReport

    vllm = types.ModuleType("vllm")
    vllm.LLM = _LLM
    lora = types.ModuleType("vllm.lora.request")
    lora.LoRARequest = lambda name, lora_id, path: (name, lora_id, path)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.lora", types.ModuleType("vllm.lora"))
    monkeypatch.setitem(sys.modules, "vllm.lora.request", lora)
    monkeypatch.setattr(vllm_engine, "require", lambda package, extra: None)
    monkeypatch.setattr(vllm_engine, "_ENGINE", {"key": None, "llm": None})
    monkeypatch.setattr(pipeline, "resolve_backend", lambda backend: "vllm")
    monkeypatch.setattr(llm, "resolve_backend", lambda backend: "vllm")
    monkeypatch.setattr(llm, "resolve_model", lambda name: name)
    monkeypatch.setattr(llm, "load_tokenizer", lambda name: types.SimpleNamespace(eos_token_id=2))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(total_memory=24 * GIB))

    def capture_runs(backend, tasks, tools, preset, traces, resume=True):
        share = getattr(getattr(backend, "engine", None), "share", "no engine")  # a remote teacher has none
        EVENTS.append(("capture" if traces.parent.name == "capture" else "teacher evaluated", share))
        return CaptureResult(runs=[], resumed=0, captured=0, failed=0, dropped_torn_line=False, seconds=0.0)

    def train_sft(preset, records, out, resume=False):
        EVENTS.append(("SFT trains", "engine alive" if _live_engine() else "card free"))
        return types.SimpleNamespace(n_examples=0, losses=[1.0], trained_tokens=0, masked_observation_tokens=0)

    def select_pool(generator, candidates, tools, preset):
        EVENTS.append(("pool screening", generator.engine.share))
        return candidates, PoolReport(len(candidates), 2, len(candidates), {t.id: 0.5 for t in candidates})

    def train_rl(preset, tasks, tools, out, adapter=None, **kwargs):
        trainer = _Trainer()  # local, as the real trainer's model is: garbage once train_rl returns
        TRAINERS.add(trainer)
        EVENTS.append(("RL trains", getattr(vllm_engine._ENGINE["llm"], "share", "no engine")))
        (out / "adapter").mkdir(parents=True, exist_ok=True)
        return types.SimpleNamespace(metrics=[{}])

    def evaluate_readouts(generator, readouts, tools, preset):
        trainer = "trainer alive" if len(TRAINERS) else "no trainer"
        results = {}
        for label in readouts:
            EVENTS.append((f"{label} evaluated", generator.engine.share, trainer))
            results[label] = types.SimpleNamespace(summary=lambda: {})
        return results

    # where the pipeline's stages look them up
    monkeypatch.setattr(pipeline, "capture_runs", capture_runs)
    monkeypatch.setattr(pipeline, "train_sft", train_sft)
    monkeypatch.setattr(pipeline, "select_pool", select_pool)
    monkeypatch.setattr(pipeline, "train_rl", train_rl)
    monkeypatch.setattr(pipeline, "evaluate_readouts", evaluate_readouts)
    monkeypatch.setattr(pipeline, "save_eval", lambda result, out: None)
    monkeypatch.setattr(pipeline, "teacher_eval", lambda runs, key_of=None: {})
    (tmp_path / "distill").mkdir()
    (tmp_path / "distill" / "kept.jsonl").write_text("")
    EVENTS.clear()
    yield tmp_path
    EVENTS.clear()


def _preset(**overrides):
    """gpu-3b-qlora's model, generation and SFT (what its memory plan reads), with few tasks."""
    few = {"capture": {"tasks": {"math/arith": 2}}, "rl": {"pool": {"math/arith": 4}, "prompts_per_step": 2},
           "eval": {"tasks": {"math/arith": 2}, "headline": ("math/arith",), "val_tasks": {}}}
    for section, fields in overrides.items():
        few[section] = {**few.get(section, {}), **fields}
    return get_preset("gpu-3b-qlora", **few)


def test_capture_engine_is_released_before_sft_and_rl_makes_its_own_at_the_planned_share(stand_ins):
    preset = _preset()
    share = rl_on_one_card(plan(preset), 24)["vllm_memory_fraction"]
    alone = engine_alone(preset, 24)["vllm_memory_fraction"]
    pipeline.capture(preset, stand_ins, resume=False)
    pipeline.sft(preset, stand_ins)
    pipeline.rl(preset, stand_ins)
    assert EVENTS == [("engine made", alone), ("capture", alone), ("engine shut down", alone),
                      ("SFT trains", "card free"),
                      ("engine made", share), ("pool screening", share), ("RL trains", share)]


def test_the_demo_order_gives_capture_and_evaluation_the_card_alone(stand_ins):
    """capture -> SFT -> RL -> control -> evaluation, as run_all orders them: capture's engine at the
    alone share, released before SFT; RL's at the shared share, released before the control (which
    samples nothing: no engine), whose trainer is gone before evaluation makes its own at the alone
    share, which the student's four systems, their sampled readings and the teacher (the same model
    here) share."""
    preset = _preset()
    share = rl_on_one_card(plan(preset), 24)["vllm_memory_fraction"]
    alone = engine_alone(preset, 24)["vllm_memory_fraction"]
    assert (share, alone) == (0.44, ALONE_SHARE_CAP)  # the L4 plan: RL beside its trainer, the card alone
    for stage in ("sft", "rl"):
        (stand_ins / stage / "adapter").mkdir(parents=True)
    pipeline.capture(preset, stand_ins, resume=False)
    pipeline.sft(preset, stand_ins)
    pipeline.rl(preset, stand_ins)
    pipeline.control(preset, stand_ins)
    pipeline.evaluate_stage(preset, stand_ins)
    read = [(f"{p}{label} evaluated", alone, "no trainer") for label in ("sft", "rl", "control") for p in ("", "sampled_")]
    assert EVENTS == [("engine made", alone), ("capture", alone), ("engine shut down", alone),
                      ("SFT trains", "card free"),
                      ("engine made", share), ("pool screening", share), ("RL trains", share),
                      ("engine shut down", share), ("RL trains", "no engine"), ("engine made", alone),
                      ("base evaluated", alone, "no trainer"), *read, ("teacher evaluated", alone)]


def test_evaluation_never_reuses_rls_engine_even_at_one_share(stand_ins):
    """An explicit gen.vllm_memory_fraction is the user's choice in every stage: capture, RL and
    evaluation all ask for it, so engine_for's key would not change; evaluation still releases
    RL's engine (sized beside a trainer) and builds its own."""
    preset = _preset(gen={"vllm_memory_fraction": 0.6})
    pipeline.capture(preset, stand_ins, resume=False)
    pipeline.rl(preset, stand_ins)
    pipeline.evaluate_stage(preset, stand_ins, which=("base",))
    assert EVENTS == [("engine made", 0.6), ("capture", 0.6), ("engine shut down", 0.6),
                      ("engine made", 0.6), ("pool screening", 0.6), ("RL trains", 0.6),
                      ("engine shut down", 0.6), ("engine made", 0.6),
                      ("base evaluated", 0.6, "no trainer"), ("teacher evaluated", 0.6)]


def test_a_larger_local_teacher_gets_its_own_alone_share(stand_ins):
    """capture.teacher_model: capture's engine is sized for the teacher's weights; evaluation's
    student engine for the student's, then released for the teacher's (another model: engine_for
    makes a new one). A remote teacher (capture.teacher_url) makes no engine and asks no share."""
    preset = _preset(capture={"teacher_model": "Qwen/Qwen2.5-7B-Instruct"})
    teacher = engine_alone(preset, 24, "Qwen/Qwen2.5-7B-Instruct")["vllm_memory_fraction"]
    student = engine_alone(preset, 24)["vllm_memory_fraction"]
    pipeline.capture(preset, stand_ins, resume=False)
    pipeline.evaluate_stage(preset, stand_ins, which=("base",))
    assert EVENTS == [("engine made", teacher), ("capture", teacher), ("engine shut down", teacher),
                      ("engine made", student), ("base evaluated", student, "no trainer"),
                      ("engine shut down", student), ("engine made", teacher), ("teacher evaluated", teacher)]
    # at 24 GiB both reach the cap; on a large card the 3B student asks for less than the 7B teacher
    assert engine_alone(preset, 141)["vllm_memory_fraction"] < \
        engine_alone(preset, 141, "Qwen/Qwen2.5-7B-Instruct")["vllm_memory_fraction"]
    EVENTS.clear()
    remote = _preset(capture={"teacher_url": "http://teacher:8000/v1", "teacher_model": "gpt-x"})
    pipeline.capture(remote, stand_ins, resume=False)  # "gpt-x" has no shape here: asking its share would fail
    pipeline.evaluate_stage(remote, stand_ins, which=("base",))
    assert EVENTS == [("capture", "no engine"), ("engine shut down", teacher), ("engine made", student),
                      ("base evaluated", student, "no trainer"), ("teacher evaluated", "no engine")]


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
        # RL's trainer as RL runs it (one packed micro-batch), beside the engine's weights and KV cache
        assert fits["together_gib"] == round(fits["rl_train_gib"] + memory["rollout_total_gib"], 2)
        assert fits["rl_train"] == "fits"
        assert fits["vllm_memory_fraction"] == round(memory["rollout_total_gib"] * MEMORY_MARGIN / 24, 2)
        assert report["sampler"] == "vllm-engine"


def test_rls_engine_share_is_the_planners_on_every_card(monkeypatch):
    """with_engine_share (RL's stage calls it, without the planner) fills the share `coa-lab plan`
    shows for this card; whether trainer and engine fit together is the planner's verdict: on an
    L4's 24 GiB they fit, on 20 GiB it is tight, on 16 they do not fit."""
    import warnings

    import torch

    for gib, verdict in ((24, "fits"), (20, "tight"), (16, "does not fit"), (80, "fits")):
        total = types.SimpleNamespace(total_memory=gib * GIB)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i, total=total: total)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            filled = with_engine_share(get_preset("gpu-3b-qlora"))
        planned = rl_on_one_card(plan(filled), gib)
        assert filled.gen.vllm_memory_fraction == planned["vllm_memory_fraction"], gib
        assert planned["rl_together"] == verdict, gib
    assert rl_on_one_card(plan(get_preset("gpu-3b-qlora")), 24)["vllm_memory_fraction"] == 0.44


# --- capture and evaluation have the card alone -----------------------------------------------


def test_capture_and_evaluation_are_priced_at_the_rows_the_engine_alone_holds():
    """With an in-process engine ("auto", "vllm") the planner decodes capture and evaluation at the
    rows the card holds with no trainer beside it (the share capped at 0.9, the margin on top,
    gen.batch_size at most); RL's rollouts and screening keep gen.kv_budget_gib's rows; the lab's
    decoder ("hf") honours kv_budget_gib in every stage, so its capture and evaluation keep them too."""
    from coa_lab.planning.plan_report import format_report, planner_report
    from coa_lab.planning.step_time import decode_seconds, gpu_spec, step_time

    preset = get_preset("gpu-3b-qlora")
    shape = shape_of(preset.model.name)
    row = kv_bytes_per_token(shape) * (512 + preset.gen.max_response_tokens)  # 72 MiB a full-length row
    by_hand = int((ALONE_SHARE_CAP * 24 * GIB / MEMORY_MARGIN - 2 * params_of(preset, shape)) // row)
    assert by_hand == engine_alone(preset, 24)["rows"] == 154 > 4 * plan(preset).rollout_batch
    for backend in ("auto", "vllm"):
        t = step_time(get_preset("gpu-3b-qlora", gen={"backend": backend}), gpu="L4")
        assert (t.eval_rows, t.capture_rows, t.engine_alone_share) == (154, 154, 0.9)
        # RL's rollouts keep the shared budget's 35 rows
        rl_seconds = decode_seconds(preset, shape, 64, 512, t.rl_response_tokens, 1, gpu_spec("L4"))[0]
        assert t.rl_rollout_seconds == rl_seconds
    hf_preset = get_preset("gpu-3b-qlora", gen={"backend": "hf"})
    hf = step_time(hf_preset, gpu="L4")
    assert (hf.eval_rows, hf.capture_rows, hf.engine_alone_share) == (35, 35, None)
    assert plan(hf_preset).rollout_batch == 35
    # the capture's 700 tasks x 21 agent calls (6 hops), at 154 rows where RL's 35 took more than twice as long
    auto, l4 = step_time(preset, gpu="L4"), gpu_spec("L4")
    alone, shared = (decode_seconds(preset, shape, 700 * 21, 512, 1024, 1, l4, rows=rows)[0] for rows in (154, None))
    assert auto.capture_hours * 3600 == pytest.approx(alone) and alone < shared / 2
    # bounded by gen.batch_size: an H200 holds all 256 rows at a share well under the cap
    h200 = step_time(preset, gpu="H200")
    assert h200.eval_rows == preset.gen.batch_size == 256 and h200.engine_alone_share < ALONE_SHARE_CAP
    assert "154   rows at once: engine alone on the card (share 0.9; RL's 35 beside the trainer)" in \
        format_report(planner_report(preset, gpu="L4"))
    hf_report = format_report(planner_report(hf_preset, gpu="L4"))
    assert "35   rows at once: the lab's decoder keeps RL's KV budget" in hf_report


def test_the_alone_share_respects_an_explicit_fraction_and_fills_one_from_this_card(monkeypatch):
    """with_engine_alone (capture and evaluation call it): gen.vllm_memory_fraction set by the user
    wins; None is filled from this card's plan (0.9 on an L4, less on an H200, where 256 rows fit)."""
    import torch

    explicit = get_preset("gpu-3b-qlora", gen={"vllm_memory_fraction": 0.6})
    assert with_engine_alone(explicit) is explicit
    for gib, share in ((24, 0.9), (141, engine_alone(get_preset("gpu-3b-qlora"), 141)["vllm_memory_fraction"])):
        total = types.SimpleNamespace(total_memory=gib * GIB)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i, total=total: total)
        assert with_engine_alone(get_preset("gpu-3b-qlora")).gen.vllm_memory_fraction == share
    assert share == 0.22  # (5.75 GiB + 256 x 72 MiB) x 1.3 / 141, rounded up


def test_the_cli_warns_before_rl_where_trainer_and_engine_do_not_fit():
    """The planner's verdict is `coa-lab rl`'s pre-flight (no stage asks the planner): the one-GPU
    preset fits an L4 (24 GiB) and does not fit half of it; a hand-set share or a server engine
    leaves the card to the user."""
    preset = get_preset("gpu-3b-qlora")
    assert rl_fit_warning(preset, 24.0) is None
    message = rl_fit_warning(preset, 12.0)
    assert message and "does not fit" in message and "coa-lab plan --preset gpu-3b-qlora" in message
    assert rl_fit_warning(get_preset("gpu-3b-qlora", gen={"vllm_memory_fraction": 0.3}), 12.0) is None
    assert rl_fit_warning(get_preset("gpu-3b-qlora", gen={"backend": "vllm-server"}), 12.0) is None
    assert rl_fit_warning(get_preset("gpu-3b-qlora", model={"name": "someone/unknown-model"}), 12.0) is None
