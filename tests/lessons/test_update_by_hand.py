"""Notebook 04's update by hand, run here from the notebook's own cells: its asserts pass as written,
and fire when the mathematics is broken in each of the ways a learner (or a later edit) breaks it:
the sign of the surrogate flipped, a per-sequence normaliser instead of the batch's policy tokens,
old log-probs recomputed at every step instead of the stale ones of the policy that sampled, and the
clip's bounds swapped. The equivalence of the trainer's packed and padded paths, its optimizer steps
and its hooks are tested in tests/rl (test_rl_update.py, test_rl_consistency.py); the lesson only
compares its own few lines against `policy_update`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from coa_lab.config import get_preset

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "04_dapo_rl.ipynb"
CELLS = ("hand-group", "hand-loss", "clip-code")  # the notebook's cell ids, in order

MUTATIONS = {
    "sign flipped": ("torch.maximum(-adv[i] * ratio, -adv[i] * clipped)", "torch.maximum(adv[i] * ratio, adv[i] * clipped)"),
    "per-sequence normaliser": ("* loss_mask[i]).sum() / n_tokens", "* loss_mask[i]).sum() / loss_mask[i].sum()"),
    "fresh old log-probs": ("loss_k, g, new = by_hand(old, tis)",
                            "loss_k, g, new = by_hand(torch.stack([logprobs(s) for s in ids]).detach(), tis)"),
    "clip bounds swapped": ("ratio.clamp(1 - r.clip_low, 1 + r.clip_high)", "ratio.clamp(1 - r.clip_high, 1 + r.clip_low)"),
}


def cell_sources() -> dict[str, str]:
    cells = {c.get("id"): "".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"]}
    return {cid: cells[cid] for cid in CELLS}


@pytest.fixture(scope="module")
def sampled():
    """The notebook's namespace after its group cell: the embedded model with a fresh LoRA as the
    policy, one group of 4 drawn by the int8-attention copy. The rate is 1e-3 and K is 3 (the lesson: the
    recipe's rate, K = 8), so that ratios reach both clip bands within a few steps at a test's cost. Its own cost
    (loading the model, quantizing the sampler's copy, sampling the group) is reported as the first test's."""
    from coa_lab.generation.models import load_model
    from coa_lab.pipeline import draw_tasks, make_tools

    base = get_preset("cpu-smoke")
    preset = dataclasses.replace(base, gen=dataclasses.replace(base.gen, max_new_tokens=32, max_response_tokens=64),
                                 rl=dataclasses.replace(base.rl, group_size=4, learning_rate=1e-3))
    policy, _ = load_model(preset.model, trainable=True)
    tools = make_tools(preset)
    pool = draw_tasks(preset, {"math/arith": 1}, "train", skip=preset.capture.tasks)

    class Result:
        adapter_dir = None

    scope = {"torch": torch, "preset": preset, "r": preset.rl, "pool": pool, "tools": tools, "result": Result,
             "load_model": load_model}
    torch.manual_seed(0)
    # the group cell loads the run's policy; here load_model returns the fresh one loaded above
    source = cell_sources()["hand-group"].replace("load_model(preset.model, adapter=result.adapter_dir, trainable=True)",
                                                  "load_model(preset.model, trainable=True)")
    exec(compile(source, "hand-group", "exec"), scope)
    scope["start_weights"] = [p.detach().clone() for p in scope["policy"].parameters() if p.requires_grad]
    return scope


def run_lesson(sampled: dict, mutation: tuple[str, str] | None = None) -> dict:
    scope = dict(sampled)
    for p, w in zip([p for p in scope["policy"].parameters() if p.requires_grad], scope["start_weights"]):
        p.data.copy_(w)
    for cid in CELLS[1:]:
        source = cell_sources()[cid].replace("K = 8 ", "K = 3 ")  # the test's size (fixture docstring)
        if mutation and mutation[0] in source:
            source = source.replace(*mutation)
        exec(compile(source, cid, "exec"), scope)
    return scope


def test_the_lessons_update_agrees_with_policy_update_and_the_clip_binds(sampled):
    scope = run_lesson(sampled)
    cuts, r = scope["cuts"], scope["r"]
    assert cuts[0]["cut"] == 0 and sum(c["cut"] for c in cuts) > 0  # on-policy first, then the clip acts
    # the swapped bounds' mutation can only show where a ratio sits between the two bounds
    ratio, on, adv = scope["ratio"], scope["on"], scope["adv"][:, None]
    between = on & (((adv > 0) & (ratio > 1 + r.clip_low) & (ratio <= 1 + r.clip_high))
                    | ((adv < 0) & (ratio < 1 - r.clip_low) & (ratio >= 1 - r.clip_high)))
    assert between.any() or any(c["kept_by_clip_higher"] for c in cuts)


@pytest.mark.parametrize("name", MUTATIONS)
def test_the_lessons_asserts_catch_a_broken_update(sampled, name):
    old, new = MUTATIONS[name]
    assert old in "".join(cell_sources().values()), f"the lesson no longer writes {old!r}: update the mutation"
    with pytest.raises(AssertionError):
        run_lesson(sampled, (old, new))
