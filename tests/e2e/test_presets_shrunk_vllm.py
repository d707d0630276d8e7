"""gpu-3b-qlora and colab-t4, the one-GPU presets whose `auto` backend is vLLM where vLLM is installed,
end to end at CPU size with vLLM's CPU build as their in-process engine: `coa-lab demo`'s stage order,
the engine made for capture, released before SFT, re-made at RL's share, released, re-made for
evaluation. Their 4-bit weights (and gpu-3b-qlora's unsloth) need CUDA and are swapped as
coa_lab/planning/shrunk.py's rule says. The other presets: tests/e2e/test_presets_shrunk.py."""

from __future__ import annotations

import pytest
from shrunk_runs import run_demo_shrunk

pytestmark = [pytest.mark.model, pytest.mark.vllm_engine]


@pytest.mark.parametrize("name", ["gpu-3b-qlora", "colab-t4"])
def test_the_preset_runs_its_whole_recipe_shrunk_through_vllm(name, tmp_path):
    run_demo_shrunk(name, tmp_path)
