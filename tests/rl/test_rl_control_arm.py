"""The SFT-only control of an RL run (rl.pg_coef = 0): it samples nothing, takes the recipe's
optimizer steps on exactly the SFT rows the recipe draws (a stream with its own RNG), and its
update is the SFT loss alone; the recipe's policy-gradient weight scales only the policy term."""

import json
import random

import pytest

from coa_lab.config import get_preset
from conftest import tiny_sft_records as _records

from coa_lab.rl.checkpoint import TaskCycle

TEXT = "<think>t</think><answer>\\boxed{2}</answer>"


def test_a_cycle_with_its_own_rng_ignores_the_global_random():
    items = _records(5)
    a, b = TaskCycle(items, rng=random.Random(3)), TaskCycle(items, rng=random.Random(3))
    first = [next(a).id for _ in range(12)]
    random.random()  # the recipe's rollouts consume global randomness between draws ...
    second = []
    for _ in range(12):
        random.shuffle(list(range(10)))
        second.append(next(b).id)
    assert first == second  # ... and the control, which samples nothing, still draws the same rows
    c = TaskCycle(items, rng=random.Random(3))
    for _ in range(7):
        next(c)
    state = c.state()
    d = TaskCycle(items, rng=random.Random(99))
    d.restore(state)  # a resumed stream continues with the saved RNG, not its fresh one
    assert [next(d).id for _ in range(5)] == first[7:12]


@pytest.mark.model
def test_control_arm_samples_nothing_and_draws_the_recipes_rows(tmp_path, monkeypatch):
    import torch

    from coa_lab.generation.result import Generation
    from coa_lab.rl import trainer
    from coa_lab.rl.trainer import train_rl
    from coa_lab.tasks.records import Task
    from coa_lab.tools.registry import build_tools

    class Alternating:  # one right, one wrong answer per group: every group carries signal
        calls = 0

        def __init__(self, tokenizer):
            self.tokenizer = tokenizer

        def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stop=()):
            Alternating.calls += 1
            outs = [TEXT, TEXT.replace("{2}", "{5}")]
            ids = [self.tokenizer(outs[i % 2], add_special_tokens=False)["input_ids"] for i in range(len(prompts))]
            return [Generation(x, self.tokenizer.decode(x), "stop", len(p)) for x, p in zip(ids, prompts)]

    drawn: dict[str, list] = {}
    real = trainer.sft_only_update

    def spy_control(model, optimizer, batches, *a, **k):
        drawn.setdefault("control", []).append([r["input_ids"] for b in batches for r in b])
        return real(model, optimizer, batches, *a, **k)

    real_update = trainer.policy_update

    def spy_recipe(*a, sft_batches=None, **k):
        drawn.setdefault("recipe", []).append([r["input_ids"] for b in sft_batches for r in b])
        return real_update(*a, sft_batches=sft_batches, **k)

    monkeypatch.setattr(trainer, "sft_only_update", spy_control)
    monkeypatch.setattr(trainer, "policy_update", spy_recipe)
    task = Task("t1", "What is 1 + 1?", ["2"], "test", "math", {})
    rl = {"steps": 2, "prompts_per_step": 1, "group_size": 2, "max_sampling_rounds": 0, "sft_coef": 1.0,
          "sft_rows": 2, "mini_batches": 2, "seed": 5}
    records = _records(3)
    train_rl(get_preset("cpu-smoke", rl=rl), [task], build_tools(["code"]), tmp_path / "recipe",
             generator_factory=lambda m, t: Alternating(t), sft_records=records)
    assert Alternating.calls > 0
    Alternating.calls = 0
    result = train_rl(get_preset("cpu-smoke", rl={**rl, "pg_coef": 0.0}), [task], build_tools(["code"]),
                      tmp_path / "control", generator_factory=lambda m, t: Alternating(t), sft_records=records)
    assert Alternating.calls == 0  # nothing sampled
    assert drawn["control"] == drawn["recipe"] and len(drawn["control"]) == 2  # the same rows, step by step
    rows = [json.loads(line) for line in (tmp_path / "control" / "metrics.jsonl").read_text().splitlines()]
    assert [r["arm"] for r in rows] == ["control", "control"]
    assert all(r["optimizer_steps"] == 2 and r["sft_loss"] > 0 for r in rows)
    recipe_rows = [json.loads(line) for line in (tmp_path / "recipe" / "metrics.jsonl").read_text().splitlines()]
    assert [r["optimizer_steps"] for r in recipe_rows] == [1, 1]  # one group: one mini-batch (documented gap)
    assert (result.adapter_dir / "adapter_config.json").exists()
    from safetensors.torch import load_file

    a = load_file(tmp_path / "control" / "adapter" / "adapter_model.safetensors")
    b = load_file(tmp_path / "recipe" / "adapter" / "adapter_model.safetensors")
    assert any(not torch.equal(a[k], b[k]) for k in a)  # the policy term moved the recipe elsewhere
    with pytest.raises(ValueError, match="trains nothing"):
        train_rl(get_preset("cpu-smoke", rl={**rl, "pg_coef": 0.0, "sft_coef": 0.0}), [task], build_tools(["code"]),
                 tmp_path / "nothing", generator_factory=lambda m, t: Alternating(t))
    with pytest.raises(ValueError, match="pg_coef must be >= 0"):
        train_rl(get_preset("cpu-smoke", rl={**rl, "pg_coef": -1.0}), [task], build_tools(["code"]),
                 tmp_path / "neg", generator_factory=lambda m, t: Alternating(t), sft_records=records)


def test_the_control_starts_no_sampler_even_where_rl_would_start_vllm(monkeypatch):
    """A vLLM engine takes a share of the card and ~a minute to start: the control samples nothing."""
    from coa_lab.rl import trainer

    monkeypatch.setattr(trainer, "resolve_backend", lambda backend: "vllm")
    monkeypatch.setattr(trainer, "rl_sampler", lambda *a: "an engine")
    rl = get_preset("cpu-smoke", rl={"pg_coef": 0.0, "sft_coef": 1.0})
    assert trainer._sampler(rl, None, None, None, None, None) is None
    assert trainer._sampler(get_preset("cpu-smoke"), None, None, None, None, None) == "an engine"


@pytest.mark.parametrize("recipe", [{"sft_coef": 0.0, "learning_rate": 2e-5}, {"sft_coef": 0.5, "learning_rate": 1e-4}])
def test_the_demos_control_is_the_arms_control_whatever_the_recipe(tmp_path, monkeypatch, recipe):
    """pipeline.control: the RL stage with the policy gradient off at eval.control_learning_rate (the arms'
    control rate); a recipe without the SFT mix is held against the SFT loss at weight 1, one with it keeps its
    weight; None: RL's own rate."""
    from coa_lab import pipeline

    for needed in ("sft/adapter", "rl"):
        (tmp_path / needed).mkdir(parents=True)
    (tmp_path / "rl" / "pool.json").write_text("{}")
    ran = []
    monkeypatch.setattr(pipeline, "new_rl_run", lambda *a: None)
    monkeypatch.setattr(pipeline, "rl", lambda preset, folder, reuse_pool: ran.append((preset.rl, folder, reuse_pool)))
    pipeline.control(get_preset("cpu-smoke", rl=recipe), tmp_path)
    rl, folder, reuse = ran[-1]
    assert (rl.pg_coef, rl.learning_rate, rl.sft_coef) == (0.0, 1e-4, recipe["sft_coef"] or 1.0)
    assert folder == tmp_path / "control" and reuse
    pipeline.control(get_preset("cpu-smoke", rl=recipe, eval={"control_learning_rate": None}), tmp_path)
    assert ran[-1][0].learning_rate == recipe["learning_rate"]
