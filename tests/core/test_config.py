"""coa_lab/config.py: presets build, overrides apply and never leak, errors are helpful."""

from __future__ import annotations

import dataclasses
import json

import pytest

from coa_lab.config import PRESETS, Preset, get_preset

CPU_PRESETS = ("cpu-tiny", "cpu-quick", "cpu-smoke")
SECTIONS = ("model", "gen", "capture", "distill", "sft", "rl", "eval")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds(name):
    p = get_preset(name)
    assert isinstance(p, Preset)
    assert p.name == name
    for section in SECTIONS:
        assert dataclasses.is_dataclass(getattr(p, section))
    d = p.to_dict()
    assert d["name"] == name and set(SECTIONS) <= set(d)
    # sanity: the numbers that the pipeline divides / slices by are positive
    assert p.rl.group_size >= 2 and p.rl.prompts_per_step >= 1
    assert 0 < p.rl.clip_low < 1 and p.rl.clip_high >= p.rl.clip_low
    assert p.rl.overlong_buffer < p.gen.max_response_tokens
    assert p.gen.max_new_tokens <= p.gen.max_response_tokens
    assert p.sft.max_length > 0 and p.distill.min_tool_calls <= p.distill.max_tool_calls


def test_default_preset_is_cpu_tiny():
    assert get_preset().name == "cpu-tiny"


def test_cpu_quick_is_the_demo_recipe_with_less_rl_and_a_smaller_test_set():
    """`make demo` (cpu-quick) must train the same SFT student as cpu-tiny (`make demo-full`), so
    the benchmarks that read runs/demo/sft/adapter measure the demo recipe's adapter either way,
    and RL's settings per step must be the ones bench_rl_seeds.py measured."""
    quick, tiny = get_preset("cpu-quick"), get_preset("cpu-tiny")
    for section in ("model", "gen", "capture", "distill", "sft"):
        assert getattr(quick, section) == getattr(tiny, section), section
    differs = {f.name for f in dataclasses.fields(tiny.rl) if getattr(quick.rl, f.name) != getattr(tiny.rl, f.name)}
    assert differs == {"steps", "pool"}
    assert quick.rl.steps < tiny.rl.steps and sum(quick.rl.pool.values()) < sum(tiny.rl.pool.values())
    assert quick.eval.val_tasks == {} and quick.eval.headline == tiny.eval.headline
    assert sum(quick.eval.tasks.values()) < sum(tiny.eval.tasks.values())


def test_the_demo_command_defaults_to_cpu_quick(monkeypatch, tmp_path):
    from coa_lab import cli, demo

    seen = {}
    monkeypatch.setattr(demo, "run_all", lambda preset, run, resume: seen.update(name=preset.name, run=run,
                                                                                     resume=resume))
    monkeypatch.setenv("COA_LAB_RUNS", str(tmp_path))
    assert cli.main(["demo"]) == 0
    assert seen == {"name": "cpu-quick", "run": tmp_path / "demo", "resume": False}


def test_a_resumed_demo_keeps_its_folders_settings_and_refuses_others(monkeypatch, tmp_path, capsys):
    from coa_lab import cli, demo

    seen = {}
    monkeypatch.setattr(demo, "run_all", lambda preset, run, resume: seen.update(preset=preset, resume=resume))
    run = tmp_path / "full"
    assert cli.main(["demo", "--resume", "--run", str(run)]) == 0  # nothing recorded yet: the demo's default
    assert seen["preset"].name == "cpu-quick" and seen["resume"] is True
    recorded = get_preset("cpu-tiny", rl={"steps": 3})
    (run / "preset.json").write_text(json.dumps(recorded.to_dict()))
    assert cli.main(["demo", "--resume", "--run", str(run)]) == 0  # no --preset: the folder's settings
    assert seen["preset"] == recorded
    seen.clear()
    assert cli.main(["demo", "--resume", "--run", str(run), "--set", "rl.steps=5"]) == 2
    assert seen == {} and "rl.steps" in capsys.readouterr().err


def test_overrides_apply():
    p = get_preset("cpu-tiny", sft={"epochs": 1, "batch_size": 2}, rl={"steps": 7}, seed=5, suites=("math",))
    assert p.sft.epochs == 1 and p.sft.batch_size == 2
    assert p.rl.steps == 7
    assert p.seed == 5 and p.suites == ("math",)
    # untouched fields keep the preset's value
    base = get_preset("cpu-tiny")
    assert p.sft.learning_rate == base.sft.learning_rate
    assert p.rl.group_size == base.rl.group_size
    assert p.gen == base.gen


def test_overrides_keep_preset_specific_values():
    p = get_preset("cpu-smoke", rl={"steps": 3})
    assert p.rl.steps == 3
    assert p.rl.group_size == get_preset("cpu-smoke").rl.group_size == 2  # not the dataclass default (4)


def test_presets_are_fresh_per_call():
    a = get_preset("cpu-tiny")
    b = get_preset("cpu-tiny")
    assert a is not b and a.rl is not b.rl and a.model is not b.model
    a.rl.steps = 999
    a.sft.epochs = 42
    a.gen.max_turns = 77
    c = get_preset("cpu-tiny")
    assert c.rl.steps != 999 and c.sft.epochs != 42 and c.gen.max_turns != 77
    assert b.rl.steps != 999


def test_override_does_not_leak_into_later_calls():
    get_preset("cpu-smoke", rl={"steps": 123}, model={"lora_r": 2})
    again = get_preset("cpu-smoke")
    assert again.rl.steps == 1 and again.model.lora_r == 16


def test_override_does_not_mutate_caller_dict():
    overrides = {"steps": 9}
    get_preset("cpu-tiny", rl=overrides)
    assert overrides == {"steps": 9}


def test_unknown_preset():
    with pytest.raises(ValueError) as exc:
        get_preset("gpu-70b")
    msg = str(exc.value)
    assert "gpu-70b" in msg
    for name in PRESETS:
        assert name in msg  # the error lists the choices


def test_unknown_section():
    with pytest.raises(ValueError, match="no section 'training'"):
        get_preset("cpu-tiny", training={"epochs": 1})


def test_unknown_field_names_the_fields():
    with pytest.raises(ValueError) as exc:
        get_preset("cpu-tiny", rl={"step": 1, "group_size": 2})
    msg = str(exc.value)
    assert "rl" in msg and "'step'" in msg
    assert "steps" in msg and "clip_high" in msg  # lists the valid fields
    assert "group_size" not in msg.split("fields:")[0]  # only the unknown one is blamed


def test_section_override_must_be_a_dict():
    with pytest.raises(ValueError, match="must be a dict"):
        get_preset("cpu-tiny", rl=5)


def test_method_name_is_not_a_section():
    with pytest.raises(ValueError):
        get_preset("cpu-tiny", to_dict={"x": 1})


@pytest.mark.parametrize("name", CPU_PRESETS)
def test_cpu_presets_have_no_gpu_only_features(name):
    p = get_preset(name)
    assert p.model.load_in_4bit is False
    assert p.model.use_unsloth is False
    assert p.gen.backend != "vllm"
    assert p.model.dtype == "float32"


def test_gpu_3b_qlora_paper_rl_settings():
    p = get_preset("gpu-3b-qlora")
    assert p.rl.group_size == 8  # paper-facts: group size 8
    assert p.rl.clip_low == 0.2 and p.rl.clip_high == 0.28  # DAPO clip-higher
    assert p.rl.learning_rate == 5e-6  # a LoRA's rate: the paper's 1e-6 is a full fine-tune's (issue 28)
    assert p.model.load_in_4bit is True and p.model.lora_r > 0
    assert p.gen.backend == "auto"  # vLLM where installed, else the lab's decoder on the GPU (issue 28)
    assert p.gen.kv_budget_gib is not None


def test_multinode_is_full_finetune():
    p = get_preset("multinode-32b")
    assert p.model.lora_r == 0 and p.model.load_in_4bit is False
    assert p.rl.group_size == 8 and (p.rl.clip_low, p.rl.clip_high) == (0.2, 0.28)


def test_a_sampling_temperature_is_set_where_it_is_used_not_in_gen():
    """Every stage passes its own temperature (eval.temperature, rl.temperature, the pool's at
    rl.temperature); a gen.temperature that no rollout read would make `--set gen.temperature=X`
    a silent no-op, so the field does not exist and asking for it is an error."""
    with pytest.raises(ValueError, match="gen has no field"):
        get_preset("cpu-tiny", gen={"temperature": 0.5})
    assert get_preset("cpu-tiny", rl={"temperature": 1.0}).rl.temperature == 1.0


def test_colab_t4_trains_a_model_that_fp16_does_not_overflow_and_fits_a_t4(monkeypatch):
    """A T4 has no bf16, so colab-t4 runs in fp16 there (models.effective_dtype). Qwen2/2.5 overflow
    to NaN in fp16 (QwenLM/Qwen3 issues 761 and 826, vllm-project/vllm issue 14126; docs/colab.md),
    so the preset's student is a Llama-architecture model, and trainer plus in-process vLLM fit a
    16 GiB T4 with the planner's margin."""
    import torch

    from coa_lab.generation.models import effective_dtype
    from coa_lab.generation.engine_share import MEMORY_MARGIN
    from coa_lab.generation.model_shape import shape_of
    from coa_lab.planning.plan_report import planner_report

    preset = get_preset("colab-t4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a T4: CUDA without bf16 units
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    assert effective_dtype(preset.model) == "float16"
    assert "qwen" not in preset.model.name.lower()
    assert preset.model.name == "meta-llama/Llama-3.2-1B-Instruct" and preset.model.dtype == "bfloat16"
    assert shape_of(preset.model.name).kv_heads == 8  # a known shape: the plan needs no download
    report = planner_report(preset, gpu="T4")
    fits = report["fits"]
    assert fits["train"] == fits["rollout"] == fits["rl_together"] == "fits", fits
    assert fits["together_gib"] * MEMORY_MARGIN <= 16
    # every rollout of an RL step (8 prompts x 8 samples) in one batch of the KV budget
    assert report["memory_gib"]["rollout_batch"] >= preset.rl.prompts_per_step * preset.rl.group_size
