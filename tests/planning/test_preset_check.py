"""Every preset's recipe can run as written, checked in seconds (coa_lab/recipe_check.py, coa_lab/planning/preset_check.py): its
draws are full, its RL pool is non-empty and disjoint from capture and from every evaluation split, the
files it names exist, and its memory plan fits the card it is sized for. Each check is shown to fire
on the mistake it is for (the empty pool the 3B and 32B presets once had among them)."""

from __future__ import annotations

import dataclasses

import pytest

from coa_lab import demo, recipe_check
from coa_lab.config import PRESETS, get_preset
from coa_lab.planning import preset_check
from coa_lab.planning.preset_check import TARGET_CARDS, memory_problems, preset_problems
from coa_lab.planning.shrunk import cpu_sized
from coa_lab.recipe_check import PresetError, data_problems, require_runnable

GPU_PRESETS = [name for name in PRESETS if not name.startswith("cpu-")]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_can_run_its_recipe(name):
    assert preset_problems(get_preset(name)) == []


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_at_cpu_size_can_run_its_recipe(name):
    assert data_problems(cpu_sized(get_preset(name))) == []


def test_every_gpu_preset_names_the_card_it_is_sized_for():
    assert sorted(TARGET_CARDS) == sorted(GPU_PRESETS)


def test_a_capture_that_takes_the_whole_train_split_leaves_rl_no_pool():
    """The bug the 3B and 32B presets had: capture took all 500 GSM8K and 400 HotpotQA train tasks."""
    preset = get_preset("gpu-3b-qlora", capture={"tasks": {"math/gsm8k": 500, "mhqa/hotpotqa": 400}})
    problems = data_problems(preset)
    assert any("math/gsm8k: asks for 120 train tasks, the split has 0 after the 500 capture uses" in p
               for p in problems), problems
    assert any("RL would find its pool empty" in p for p in problems), problems


def test_a_pool_that_overlaps_capture_and_an_eval_set_is_refused(monkeypatch):
    """Without the skip the pool would be capture's own tasks; an evaluation mix on the train split meets both."""
    from coa_lab.tasks import draws

    real = draws.draw_tasks

    def no_skip(preset, mix, split, skip=None, from_end=False):  # a pipeline that forgot capture's offset
        return real(preset, mix, split, None, from_end)

    monkeypatch.setattr(recipe_check, "draw_tasks", no_skip)
    problems = data_problems(get_preset("cpu-smoke"))
    assert any(p.startswith("capture and the RL pool share") for p in problems), problems


def test_an_eval_task_in_the_train_pool_is_refused(monkeypatch):
    real = recipe_check.draw_tasks

    def eval_from_train(preset, mix, split, skip=None, from_end=False):
        return real(preset, mix, "train" if split == "test" else split, skip, from_end)

    monkeypatch.setattr(recipe_check, "draw_tasks", eval_from_train)
    problems = data_problems(get_preset("cpu-smoke"))
    assert any(p.startswith("capture and the test split share") for p in problems), problems


def test_a_short_split_an_unknown_benchmark_and_a_missing_file_are_named(monkeypatch):
    preset = get_preset("cpu-smoke", eval={"tasks": {"math/aime24": 31, "math/nope": 1, "math/arith": 1},
                                           "headline": ("math/arith",)})
    problems = data_problems(preset)
    assert any("eval.tasks math/aime24: asks for 31 test tasks, the split has 30" in p for p in problems), problems
    assert any(p.startswith("eval.tasks math/nope: cannot load") for p in problems), problems
    monkeypatch.setitem(recipe_check.LAUNCH_FILES, "cpu-smoke", ("configs/slurm/no_such.sbatch",))
    assert any("configs/slurm/no_such.sbatch is missing" in p for p in data_problems(get_preset("cpu-smoke")))


def test_a_plan_over_the_card_is_named(monkeypatch):
    """multinode-32b at the paper's full 32k context: one sequence's unsharded logits (46 GiB) and
    activations (51 GiB) alone exceed the H100 it is sized for."""
    problems = memory_problems(get_preset("multinode-32b", sft={"max_length": 32768}))
    assert any(p.startswith("SFT plans") and "H100" in p and p.endswith("does not fit") for p in problems), problems
    assert memory_problems(get_preset("multinode-32b")) == []
    # RL's learner as a bf16 replica (no 4-bit base) does not fit an H100; H200 nodes hold it
    bf16 = dataclasses.replace(TARGET_CARDS["multinode-32b"], rl_model=(("lora_r", 64),))
    monkeypatch.setitem(preset_check.TARGET_CARDS, "multinode-32b", bf16)
    assert any(p.startswith("RL's trainer plans") for p in memory_problems(get_preset("multinode-32b")))
    monkeypatch.setitem(preset_check.TARGET_CARDS, "multinode-32b", dataclasses.replace(bf16, gpu="H200"))
    assert memory_problems(get_preset("multinode-32b")) == []


def test_the_demo_refuses_an_unrunnable_preset_before_any_stage(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(demo, "_stage", lambda name, resume: ran.append(name))
    preset = get_preset("cpu-smoke", rl={"pool": {"math/arith": 2400}})
    with pytest.raises(PresetError, match="rl.pool math/arith: asks for 2400 train tasks"):
        demo.run_all(preset, tmp_path / "run")
    assert ran == [] and not (tmp_path / "run").exists()
    require_runnable(get_preset("cpu-smoke"))  # a runnable one passes
