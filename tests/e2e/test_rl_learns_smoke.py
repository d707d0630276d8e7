"""End to end on the real embedded model: a short masked SFT on tool-arithmetic trajectories,
then DAPO steps on the smoke preset that actually UPDATE the policy (mixed groups exist).

The trajectories are rendered from generated level-1 tasks with the real sandbox output (a
perfect "teacher"), so the test stays short; the demo does the same with the multi-agent
teacher's own runs.
"""

import json

import pytest
import torch

from coa_lab.config import get_preset
from coa_lab.rl.trainer import train_rl
from coa_lab.training.sft import train_sft
from coa_lab.tasks.arithmetic import generate
from coa_lab.tools.registry import build_tools
from coa_lab.trajectories import TrajectoryRecord

pytestmark = pytest.mark.model


def trajectory(task, tools) -> str:
    expr = task.metadata["expression"]
    code = f"```python\nprint({expr})\n```"
    printed = tools.get("code")(code).text.strip()  # the real sandbox, as in a rollout
    assert printed == task.answers[0]
    return (f"<think>I need {expr}.</think>\n<code>\n{code}\n</code>\n<observation>\n{printed}\n</observation>\n"
            f"<think>The answer is {printed}.</think>\n<answer>\\boxed{{{printed}}}</answer>")


def lora_state(adapter_dir):
    from safetensors.torch import load_file

    return load_file(str(adapter_dir / "adapter_model.safetensors"))


def test_sft_then_rl_updates_on_every_step(tmp_path):
    tools = build_tools(["code"])
    tasks = generate("train", 36, seed=7, levels=(1,))
    records = [TrajectoryRecord(f"g{i}", t.id, "gold", "math", t.question, t.answers, trajectory(t, tools))
               for i, t in enumerate(tasks[:24])]
    preset = get_preset("cpu-smoke", sft={"epochs": 2, "batch_size": 2, "learning_rate": 3e-4},
                        rl={"steps": 2, "prompts_per_step": 2, "group_size": 4, "max_sampling_rounds": 3,
                            "temperature": 1.0, "learning_rate": 1e-4})
    sft = train_sft(preset, records, tmp_path / "sft")
    assert sft.losses[-1] < sft.losses[0]
    before = lora_state(sft.adapter_dir)
    result = train_rl(preset, tasks[24:], tools, tmp_path / "rl", adapter=sft.adapter_dir)
    rows = [json.loads(line) for line in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        # an informative group exists at every step: the SFT policy solves some, not all
        assert 0.0 < row["accuracy"] < 1.0, row
        assert row["kept_groups"] >= 1 and "loss" in row and row["train_tokens"] > 0, row
    after = lora_state(result.adapter_dir)
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the update moved the weights
