"""Whether a preset's memory plan fits the card it is sized for, stage by stage, with the planner's
margin: the other half of "can this preset run as written" (its data: coa_lab/recipe_check.py).
`preset_problems` gives both; tests/planning/test_preset_check.py holds every preset to them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from coa_lab.config import Preset
from coa_lab.generation.backends import PROMPT_TOKENS
from coa_lab.generation.model_shape import shape_of
from coa_lab.planning.memory_plan import fit_verdict, plan, rl_on_one_card
from coa_lab.planning.step_time import gpu_spec
from coa_lab.recipe_check import data_problems
from coa_lab.rl.micro_batch import MICRO_BATCH


@dataclass(frozen=True)
class TargetCard:
    gpu: str  # a name of coa_lab.planning.step_time.GPUS
    gpus: int  # training GPUs the stages share (data parallel or sharded)
    # the model settings RL trains with where they differ from SFT's (a stage's --set in the launch script)
    rl_model: tuple[tuple[str, object], ...] = ()


# The card each GPU preset is sized for (its docstring names it). multinode-32b: two training nodes of
# eight H100s (configs/slurm/multinode_32b.sbatch: the third node serves vLLM), RL as that script runs it:
# a rank-64 LoRA on the SFT model loaded in 4 bits, replicated on every GPU (DDP: RL refuses sharding).
TARGET_CARDS = {
    "gpu-smoke": TargetCard("T4", 1),
    "colab-t4": TargetCard("T4", 1),
    "gpu-3b-qlora": TargetCard("L4", 1),
    "multinode-32b": TargetCard("H100", 16, rl_model=(("lora_r", 64), ("load_in_4bit", True))),
}


def memory_problems(preset: Preset) -> list[str]:
    """Where the preset's memory plan does not fit the card it is sized for (TARGET_CARDS) with the
    planner's margin, stage by stage: SFT's training step, RL's trainer (with an in-process engine:
    trainer and sampler together). A "tight" plan counts: the planner has run up to 22% under a
    measured peak, so a plan that fits only without the margin is a likely out-of-memory error."""
    card = TARGET_CARDS.get(preset.name)
    if card is None:
        return []
    spec = gpu_spec(card.gpu)
    problems = []
    sft = plan(preset, card.gpus, shape_of(preset.model.name))
    verdict = fit_verdict(sft.train_total_gib, spec.memory_gib)
    if verdict != "fits":
        problems.append(f"SFT plans {sft.train_total_gib:.1f} GiB per {card.gpu} ({spec.memory_gib:.0f} GiB) "
                        f"on {card.gpus} GPU(s): {verdict}")
    rl = plan(rl_update_preset(preset), card.gpus, shape_of(preset.model.name))
    if preset.gen.backend in ("vllm", "auto"):  # an in-process engine shares the trainer's card during RL
        together = rl_on_one_card(rl, spec.memory_gib)
        if together["rl_together"] != "fits":
            problems.append(f"RL plans {together['together_gib']} GiB for trainer and in-process vLLM on one "
                            f"{card.gpu} ({spec.memory_gib:.0f} GiB): {together['rl_together']}")
    elif (verdict := fit_verdict(rl.train_total_gib, spec.memory_gib)) != "fits":
        problems.append(f"RL's trainer plans {rl.train_total_gib:.1f} GiB per {card.gpu} "
                        f"({spec.memory_gib:.0f} GiB) on {card.gpus} GPU(s): {verdict}")
    return problems


def rl_update_preset(preset: Preset) -> Preset:
    """The preset as the planner must price RL's update: the model RL trains (TARGET_CARDS' rl_model), and one
    micro-batch of full-length rollouts packed into one sequence (rl/update_batch.py's MICRO_BATCH rows
    of a typical prompt + gen.max_response_tokens), in place of SFT's batch."""
    card = TARGET_CARDS.get(preset.name, TargetCard("H100", 1))
    rows = min(MICRO_BATCH, preset.rl.group_size * preset.rl.prompts_per_step)
    packed = rows * (PROMPT_TOKENS + preset.gen.max_response_tokens)
    return dataclasses.replace(preset, model=dataclasses.replace(preset.model, **dict(card.rl_model)),
                               sft=dataclasses.replace(preset.sft, batch_size=1, max_length=packed))


def preset_problems(preset: Preset, memory: bool = True) -> list[str]:
    """data_problems, and (memory) memory_problems: every reason the recipe cannot run as written."""
    return data_problems(preset) + (memory_problems(preset) if memory else [])
