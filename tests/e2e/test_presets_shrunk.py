"""Every preset's whole recipe, end to end on the CPU, at the size coa_lab/planning/shrunk.py's one rule
gives it: the preset's own data, splits, pools, stage order, filters, engine choice and settings, with
the model swapped for the embedded one. A preset whose structure cannot run (an empty pool, a missing
file, a stage order that needs an engine it does not have) fails here, on every CI run, not hours into
a paid GPU run. Its full-size data and memory plan are checked in tests/planning/test_preset_check.py.

Stage orders: the single-machine presets run `coa-lab demo`'s (capture, distill, SFT, RL, RL's control,
evaluation; demo.run_all). multinode-32b runs its launch script's: capture and distill on one node, then
configs/slurm/multinode_32b.sbatch itself under SLURM shims (the full fine-tune under ZeRO-3 on two
"nodes", `vllm serve` on the SFT model with runtime LoRA loading, RL as a rank-64 LoRA sampling from it,
evaluation through the same server).

Engines: `auto` resolves as on a GPU machine with the same packages (vLLM's CPU build where it is
installed); 4-bit weights and unsloth exist only on CUDA and are swapped as the rule says.

Where each preset runs (three files, so that the test workers share them): cpu-tiny and gpu-smoke here;
gpu-3b-qlora and colab-t4 (in-process vLLM) in test_presets_shrunk_vllm.py; multinode-32b in
test_presets_shrunk_multinode.py; cpu-smoke is its own shrunk size, run whole by test_pipeline_smoke.py.
cpu-quick at CPU size is cpu-tiny's preset without validation tasks (asserted below): its every stage is
cpu-tiny's run, and evaluation without validation runs in the GPU presets'; its whole run is `pytest -m slow`.
"""

from __future__ import annotations

import pytest
from shrunk_runs import run_demo_shrunk

from coa_lab.config import PRESETS, get_preset, preset_differences
from coa_lab.planning.shrunk import cpu_sized

pytestmark = pytest.mark.model

RUN_HERE = ["cpu-tiny", "gpu-smoke"]
RUN_ELSEWHERE = {"cpu-smoke": "test_pipeline_smoke.py", "gpu-3b-qlora": "test_presets_shrunk_vllm.py",
                 "colab-t4": "test_presets_shrunk_vllm.py", "multinode-32b": "test_presets_shrunk_multinode.py",
                 "cpu-quick": "cpu-tiny's run (below) and, whole, pytest -m slow"}


def test_every_preset_runs_somewhere():
    assert sorted(RUN_HERE + list(RUN_ELSEWHERE)) == sorted(PRESETS)


def test_cpu_smoke_is_its_own_shrunk_size():
    assert cpu_sized(get_preset("cpu-smoke")) == get_preset("cpu-smoke")


def test_cpu_quick_at_cpu_size_is_cpu_tiny_without_validation():
    quick, tiny = cpu_sized(get_preset("cpu-quick")), cpu_sized(get_preset("cpu-tiny"))
    assert preset_differences(tiny, quick) == ["name: 'cpu-tiny' -> 'cpu-quick'",
                                              "eval.val_tasks: {'math/arith': 1, 'mhqa/lookup': 1} -> {}"]


@pytest.mark.parametrize("name", RUN_HERE)
def test_the_preset_runs_its_whole_recipe_shrunk(name, tmp_path):
    run_demo_shrunk(name, tmp_path)


@pytest.mark.slow
def test_cpu_quick_runs_its_whole_recipe_shrunk(tmp_path):
    run_demo_shrunk("cpu-quick", tmp_path)
