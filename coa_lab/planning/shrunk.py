"""Every preset's recipe at a size a CPU runs in minutes: one rule, so a GPU preset's structure (its data,
splits, pools, stage order, filters, engines and settings) is exercised on every CI run before anyone
pays for a GPU (tests/e2e/test_presets_shrunk.py).

The rule, applied to any preset:
1. counts: cpu-smoke's (`smoke_counts`): at most 2 tasks per benchmark of every mix (1 per multi-hop and
   validation benchmark), 2 imported trajectories per file, 1 SFT epoch, 1 RL step of at most 2 x 2
   with no refill draws, at most 2 screening samples and 2 evaluation samples; training's layers not compiled
   (model.cpu_compile: compiling takes longer than such a stage trains);
2. sizes: no length, batch, turn or hop above cpu-smoke's (`CPU_CAPS`); accumulation, mini-batches and
   the KV budget keep their role, at most 2 of each;
3. the model: the embedded SmolLM2-135M (the hub is out of reach) in the preset's dtype, LoRA rank and
   full-or-LoRA choice; the preset's teacher model likewise. bf16 stays bf16 where this CPU computes it
   natively (models.cpu_bf16_is_fast) and becomes fp32 where it only emulates it (~150x slower on an
   AVX2-only CPU), as a GPU without bf16 units stands in fp16 (models.effective_dtype);
4. engines: the same choice resolved as on a GPU machine with the same packages: `auto` is vLLM where
   vLLM is installed (its CPU build here), else the lab's decoder; `vllm` and `vllm-server` stay. Two
   engines exist only on CUDA and are swapped for the path they wrap: 4-bit weights (bitsandbytes NF4)
   become the preset's dtype (bitsandbytes 0.50 quantizes on a CPU too, but ~100 s a load here), and
   unsloth becomes plain transformers + peft (its behaviour the lab relies on is checked in
   tests/training/test_unsloth_behaviour.py). `dropped_engines` names what a run swapped.
Everything else (rates, clip range, advantages, filters, pools' pass band, headline, flags) is the preset's.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json

from coa_lab.config import EMBEDDED_MODEL, Preset, get_preset
from coa_lab.generation.models import cpu_bf16_is_fast

SMOKE = 2  # tasks per benchmark of a mix; rows of RL's step; samples
# cpu-smoke's sizes: the ceiling for every preset's token budgets, batches, turns and hops
CPU_CAPS = {"max_new_tokens": 48, "max_turns": 2, "max_response_tokens": 160, "batch_size": 8,
            "teacher_max_new_tokens": 32, "max_hops": 2, "max_trajectory_tokens": 320, "sft_batch": 4,
            "max_length": 320, "overlong_buffer": 32, "observation_chars": 300}


def _cut(mix: dict[str, int], n: int = SMOKE) -> dict[str, int]:
    return {k: min(v, n) for k, v in mix.items()}


def smoke_counts(preset: Preset) -> Preset:
    """Rule 1 alone: the preset's model, precision, backend and recipe at cpu-smoke's counts (a lesson's
    smoke mode for any preset, coa_lab.lessons.inputs.smoke_sized)."""
    c, r, e = preset.capture, preset.rl, preset.eval
    return dataclasses.replace(
        preset,
        model=dataclasses.replace(preset.model, cpu_compile=False),
        capture=dataclasses.replace(c, tasks=_cut(c.tasks), multi_hop_tasks=_cut(c.multi_hop_tasks, 1)),
        distill=dataclasses.replace(preset.distill, imported_per_suite=min(preset.distill.imported_per_suite, SMOKE)),
        sft=dataclasses.replace(preset.sft, epochs=1),
        rl=dataclasses.replace(r, steps=1, prompts_per_step=min(r.prompts_per_step, SMOKE),
                               group_size=min(r.group_size, SMOKE), max_sampling_rounds=0, pool=_cut(r.pool),
                               pool_samples=min(r.pool_samples, SMOKE)),
        eval=dataclasses.replace(e, tasks=_cut(e.tasks), val_tasks=_cut(e.val_tasks, 1), samples=min(e.samples, SMOKE)),
    )


def resolved_backend(backend: str) -> str:
    """gen.backend as a GPU machine with this machine's packages resolves it: "auto" is vLLM where vLLM
    is installed (generation/backends.py also asks for CUDA; here its CPU build stands in)."""
    if backend != "auto":
        return backend
    return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"


def dropped_engines(preset: Preset) -> list[str]:
    """The CUDA-only engines the preset names, which a CPU run swaps (rule 4)."""
    m = preset.model
    return [name for name, on in (("bitsandbytes 4-bit", m.load_in_4bit), ("unsloth", m.use_unsloth)) if on]


def cpu_sized(preset: Preset) -> Preset:
    """The preset's whole recipe under the rule above."""
    p = smoke_counts(preset)
    caps = CPU_CAPS
    m, g, c, d, s, r = p.model, p.gen, p.capture, p.distill, p.sft, p.rl
    teacher = None if c.teacher_model is None else EMBEDDED_MODEL
    return dataclasses.replace(
        p,
        model=dataclasses.replace(m, name=EMBEDDED_MODEL, load_in_4bit=False, use_unsloth=False,
                                  dtype="float32" if m.dtype == "bfloat16" and not cpu_bf16_is_fast() else m.dtype),
        gen=dataclasses.replace(g, backend=resolved_backend(g.backend),
                                max_new_tokens=min(g.max_new_tokens, caps["max_new_tokens"]), max_turns=min(g.max_turns, caps["max_turns"]),
                                max_response_tokens=min(g.max_response_tokens, caps["max_response_tokens"]),
                                batch_size=min(g.batch_size, caps["batch_size"]),
                                observation_chars=min(g.observation_chars, caps["observation_chars"])),
        capture=dataclasses.replace(c, teacher_model=teacher, max_hops=min(c.max_hops, caps["max_hops"]),
                                    multi_hop_hops=min(c.multi_hop_hops, caps["max_hops"]),
                                    teacher_max_new_tokens=min(c.teacher_max_new_tokens,
                                                               caps["teacher_max_new_tokens"])),
        distill=dataclasses.replace(d, max_trajectory_tokens=min(d.max_trajectory_tokens, caps["max_trajectory_tokens"])),
        sft=dataclasses.replace(s, batch_size=min(s.batch_size, caps["sft_batch"]), grad_accum=min(s.grad_accum, SMOKE),
                                max_length=min(s.max_length, caps["max_length"])),
        rl=dataclasses.replace(r, mini_batches=min(r.mini_batches, SMOKE),
                               overlong_buffer=min(r.overlong_buffer, caps["overlong_buffer"])),
    )


def set_overrides(preset: Preset) -> list[str]:
    """`preset` as `--set section.field=value` items over its named preset (values compact JSON, no
    spaces, so a launch script may split them on whitespace): how a script that names a preset, such
    as configs/slurm/multinode_32b.sbatch's PRESET and SET, runs it at CPU size."""
    named, mine = get_preset(preset.name).to_dict(), preset.to_dict()
    out = []
    for section, fields in mine.items():
        if not isinstance(fields, dict):
            continue
        for key, value in fields.items():
            if value != named[section][key]:
                shown = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
                out.append(f"{section}.{key}={shown}")
    return out


if __name__ == "__main__":  # python -m coa_lab.planning.shrunk gpu-3b-qlora: the --set items of its CPU size
    import sys

    print(" ".join(f"--set {item}" for item in set_overrides(cpu_sized(get_preset(sys.argv[1])))))
