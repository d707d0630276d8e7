"""coa_lab/config.py reads as the recipe: every dataclass defaults to what `cpu-tiny` runs, and
every preset's resolved settings are pinned, so moving a default never moves a preset silently.

A preset change on purpose updates the snapshot too:

    python -m tests.core.test_config_recipe   # rewrites tests/core/data/presets.json
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from coa_lab.config import PRESETS, Preset, get_preset

SNAPSHOT = Path(__file__).parent / "data" / "presets.json"


def resolved(name: str) -> dict:
    """A preset's settings as JSON holds them (tuples become lists)."""
    return json.loads(json.dumps(get_preset(name).to_dict()))


def test_the_dataclass_defaults_are_cpu_tinys_recipe():
    tiny = get_preset("cpu-tiny")
    assert tiny == Preset(name="cpu-tiny")
    for f in dataclasses.fields(Preset):
        if f.default_factory is not dataclasses.MISSING:
            assert getattr(tiny, f.name) == f.default_factory(), f.name
    # the recipe's measured RL settings (docs/design.md), not a paper default nobody measured here
    rl = tiny.rl
    assert (rl.steps, rl.prompts_per_step, rl.group_size, rl.sft_coef, rl.learning_rate) == (16, 6, 8, 0.0, 2e-5)
    assert (rl.mini_batches, rl.warmup_steps, rl.advantage, sum(rl.pool.values())) == (1, 2, "dr_grpo", 200)
    assert tiny.sft.epochs == 7.0  # converged on validation (docs/rl-effect.md, step 6)
    assert tiny.distill.imported_sources == ("fireact", "r1searcher") and tiny.distill.max_tool_calls == 2
    assert tiny.capture.multi_hop_tasks == {"math/arith": 8, "mhqa/lookup": 4}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_resolves_to_its_snapshot(name):
    pinned = json.loads(SNAPSHOT.read_text())
    assert set(pinned) == set(PRESETS), "a preset was added or removed: rewrite the snapshot"
    assert resolved(name) == pinned[name], (
        f"{name}'s settings moved: if on purpose, `python -m tests.core.test_config_recipe`")


if __name__ == "__main__":
    SNAPSHOT.write_text(json.dumps({name: resolved(name) for name in PRESETS}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}")
