"""The lessons' numbers typed as plain text, against where each comes from.

A figure linked into a result file (`[0.81](figures/x.json "path")`) is checked by
test_published_figures.py; a number the text simply states — a preset's setting, a time, a plan's
GiB — is not, and drifts when its source changes. Each claim below is a phrase of a lesson's
markdown (links removed first, so only unlinked text matches) with the number(s) it states
captured, and the function that computes them from their source: a preset in coa_lab/config.py,
the planner, the Makefile's targets, a published result, the shipped splits, or the lesson's own
code. A stated number agrees when its source, rounded to the digits stated, equals it. A phrase
that no longer appears fails too: reword the claim here with the lesson.
"""

from __future__ import annotations

import ast
import json
import math
import re
from functools import cache

import pytest

from coa_lab.config import get_preset
from coa_lab.paths import DATASETS_DIR, PROJECT_ROOT

NOTEBOOK_DIR = PROJECT_ROOT / "notebooks"
RESULTS_DIR = PROJECT_ROOT / "docs" / "results"
LINK = re.compile(r"\[([^\[\]]*)\]\([^()]*\)")  # [text](target "title"): a link, checked elsewhere
WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
         "ten": 10}


# ---- the lessons' text and code ----

@cache
def _cells(lesson: str, kind: str) -> str:
    [path] = NOTEBOOK_DIR.glob(f"{lesson}_*.ipynb")
    cells = json.loads(path.read_text())["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == kind)


def prose(lesson: str) -> str:
    """The lesson's markdown with every link replaced by a marker and whitespace collapsed, so a
    phrase matches across a line break and never inside a link."""
    return " ".join(LINK.sub("⟨link⟩", _cells(lesson, "markdown")).split())


def code_value(lesson: str, pattern: str):
    """The Python literal the first group of `pattern` captures in the lesson's code cells."""
    found = re.search(pattern, _cells(lesson, "code"))
    assert found, f"notebook {lesson}'s code no longer matches {pattern!r}"
    return ast.literal_eval(found.group(1))


# ---- the sources ----

@cache
def preset(name: str):
    return get_preset(name)


def tiny():
    return preset("cpu-tiny")


def smoke():
    return preset("cpu-smoke")


def makefile_recipe(target: str) -> str:
    """The command lines of one Makefile target."""
    lines = (PROJECT_ROOT / "Makefile").read_text().splitlines()
    start = lines.index(next(line for line in lines if line.startswith(f"{target}:")))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    assert recipe, f"the Makefile's {target} target runs nothing"
    return "\n".join(recipe)


def demo_full_preset() -> str:
    return re.search(r"--preset (\S+)", makefile_recipe("demo-full")).group(1)


def demo_full_minutes() -> float:
    """The published `make demo-full`: the stages' seconds of the run of the Makefile's preset."""
    result = json.loads((RESULTS_DIR / "demo.json").read_text())
    assert result["preset"] == demo_full_preset(), "docs/results/demo.json is not the preset `make demo-full` runs"
    return result["summary"]["seconds"] / 60


def notebook_full_minutes(number: str) -> float:
    return json.loads((RESULTS_DIR / "notebooks_full.json").read_text())["by_number"][number] / 60


def confirm_tasks() -> int:
    """The confirmation split's size: every family's confirm ids (datasets/heldout_splits.json)."""
    splits = json.loads((DATASETS_DIR / "heldout_splits.json").read_text())
    return sum(len(family["confirm"]) for family in splits["families"].values())


@cache
def memory(name: str, gpus: int = 1):
    from coa_lab.planning.memory_plan import plan

    return plan(preset(name), gpus)


def memory_at_length(name: str, gpus: int, max_length: int):
    """The plan with SFT sequences of `max_length` tokens (the longest sequence sets the per-sequence terms)."""
    from coa_lab.planning.memory_plan import plan

    return plan(get_preset(name, sft={"max_length": max_length}), gpus)


def unchunked_logits_gib(name: str, gpus: int = 1) -> float:
    from coa_lab.planning.memory_plan import plan

    return plan(preset(name), gpus, logits_chunk=None).logits_gib


def lm_head_chunk() -> int:
    from coa_lab.planning.memory_plan import CHUNK

    return CHUNK


def kv_row_k_tokens(name: str) -> float:
    """A full-length rollout row, in thousands (1,024) of tokens: the prompt the decoder budgets for
    plus the trajectory budget."""
    from coa_lab.generation.backends import PROMPT_TOKENS

    return (PROMPT_TOKENS + preset(name).gen.max_response_tokens) / 1024


def calibration_range() -> tuple[float, float]:
    """How far the plan runs under and over the measured peaks, in percent (lesson 06's table)."""
    from coa_lab.planning.plan_report import VALIDATION_RUNS, calibration

    ratios = [r.ratio for path in VALIDATION_RUNS for r in calibration(path) if r.quantity == "peak_gib"]
    return (1 - min(ratios)) * 100, (max(ratios) - 1) * 100


def zero3_state_gib(name: str, gpus: int) -> float:
    m = memory(name, gpus)
    return m.weights_gib + m.gradients_gib + m.optimizer_gib


def unsharded_state_gib(name: str) -> float:
    """bf16 weights and gradients, 8 bytes of Adam state and a 4-byte fp32 master copy a parameter."""
    return memory(name).params * (2 + 2 + 8 + 4) / 1024**3


def sum_of(mix: dict) -> int:
    return sum(mix.values())


def smoke_mix(lesson: str) -> dict:
    """The task mix a lesson's code uses under SMOKE (`mix = {...} if SMOKE else ...`)."""
    return code_value(lesson, r"mix = (\{[^}]*\}) if SMOKE")


def full_mix(lesson: str) -> dict:
    """The task mix a lesson's code uses in its full run (`mix = ... if SMOKE else {...}`)."""
    return code_value(lesson, r"mix = \{[^}]*\} if SMOKE else (\{[^}]*\})")


def by_family(mix: dict) -> tuple[int, int, int]:
    """(all, arithmetic, look-ups) of a task mix."""
    return sum_of(mix), mix["math/arith"], mix["mhqa/lookup"]


def lesson04_steps() -> int:
    """The RL steps of lesson 04's full run (its Setup overrides the preset's)."""
    return code_value("04", r"get_preset\(PRESET, rl=\{\"steps\": (\d+)\}\)")


def lesson04_candidates() -> int:
    """The train questions lesson 04's full run screens for its pool."""
    return sum_of(code_value("04", r"candidates = draw_tasks\(preset, \{[^}]*\} if SMOKE else (\{[^}]*\})"))


# ---- the claims: (lesson, phrase with the stated number(s) as groups, their source) ----

CLAIMS = [
    # 00 · Tour
    ("00", r"`make demo-full` runs the whole of it \(([\w-]+), about", demo_full_preset),
    ("00", r"`make demo-full` runs the whole of it \([\w-]+, about (\d+) minutes", demo_full_minutes),
    # 01 · Capture
    ("01", r"`SMOKE=1` \(set by the test suite\) captures (\d+) tasks",
     lambda: sum_of(smoke_mix("01"))),
    ("01", r"captures the cpu-tiny mix \((\d+) tasks\)", lambda: sum_of(tiny().capture.tasks)),
    ("01", r"`capture.multi_hop_hops` = (\d+) hops", lambda: tiny().capture.multi_hop_hops),
    ("01", r"the (\w+) most similar hand-written worked runs", lambda: tiny().capture.few_shot),
    # 02 · Distillation
    ("02", r"each agent had its own instruction and (\w+) worked examples", lambda: tiny().capture.few_shot),
    ("02", r"at most `max_tool_calls` \(cpu-tiny: (\d+),", lambda: tiny().distill.max_tool_calls),
    ("02", r"`gen.max_turns` = (\d+) is", lambda: tiny().gen.max_turns),
    ("02", r"mixes in (\d+) runs from each imported search file", lambda: tiny().distill.imported_per_suite),
    ("02", r"SFT set takes (\d+) runs of each search file", lambda: tiny().distill.imported_per_suite),
    ("02", r"fit cpu-tiny's (\d+)-token budget", lambda: tiny().distill.max_trajectory_tokens),
    # 03 · Masked SFT
    ("03", r"`SMOKE=1` \(set by the test suite\) trains (\w+) epoch", lambda: smoke().sft.epochs),
    ("03", r"trajectories and evaluates (\d+) tasks", lambda: sum_of(smoke_mix("03"))),
    ("03", r"\(cpu-tiny: (\d+) epochs", lambda: tiny().sft.epochs),
    ("03", r"kept trajectories, (\d+) epochs,", lambda: tiny().sft.epochs),
    ("03", r"On this run's (\d+) held-out tasks \((\d+) arithmetic and (\d+) look-ups",
     lambda: by_family(full_mix("03"))),
    # 04 · DAPO RL (read here, owned by the lead)
    ("04", r"`SMOKE=1` \(the test suite\) runs (\w+) step of (\d+) questions x (\d+) samples",
     lambda: (smoke().rl.steps, smoke().rl.prompts_per_step, smoke().rl.group_size)),
    ("04", r"the full run screens (\d+) questions and runs (\d+) steps of (\d+) x (\d+)",
     lambda: (lesson04_candidates(), lesson04_steps(), tiny().rl.prompts_per_step, tiny().rl.group_size)),
    ("04", r"`rl.advantage=\"(\w+)\"`", lambda: tiny().rl.advantage),
    ("04", r"\(ε_low ([\d.]+), ε_high ([\d.]+)\)", lambda: (tiny().rl.clip_low, tiny().rl.clip_high)),
    ("04", r"Screening (\d+) candidates (\d+) times each",
     lambda: (lesson04_candidates(), tiny().rl.pool_samples)),
    ("04", r"(\w+) steps of (\d+) pool questions x (\d+) samples, plus (\d+) anchor questions",
     lambda: (lesson04_steps(), tiny().rl.prompts_per_step, tiny().rl.group_size, tiny().rl.anchors_per_step)),
    ("04", r"the (\d+)-step warm-up", lambda: tiny().rl.warmup_steps),
    ("04", r"groups of (\d+) rollouts", lambda: tiny().rl.group_size),
    ("04", r"the recipe's (\d+) steps", lambda: tiny().rl.steps),
    ("04", r"what was sampled at T = ([\d.]+)", lambda: tiny().rl.temperature),
    ("04", r"Dr\. GRPO, rate ([\d.e-]+), no SFT mix", lambda: tiny().rl.learning_rate),
    # 05 · Evaluation
    ("05", r"`SMOKE=1` \(set by the test suite\) evaluates (\d+) tasks",
     lambda: sum_of(smoke_mix("05"))),
    ("05", r"the full run evaluates (\d+) held-out tasks",
     lambda: sum_of(full_mix("05"))),
    ("05", r"runs the teacher on the same (\d+), and samples (\d+) answers per task",
     lambda: (sum_of(full_mix("05")), code_value("05", r"\nK = (\d+)"))),
    ("05", r"samples K = (\d+) answers per task at RL's own temperature", lambda: code_value("05", r"\nK = (\d+)")),
    ("05", r"sampling at T = ([\d.]+) sometimes", lambda: tiny().rl.temperature),
    ("05", r"On the same (\d+) held-out tasks \((\d+) arithmetic, (\d+) look-ups\)",
     lambda: by_family(full_mix("05"))),
    ("05", r"after notebook 04's (\w+) RL steps", lesson04_steps),
    ("05", r"not the recipe's (\d+)", lambda: tiny().rl.steps),
    ("05", r"five seeds on (\d+) tasks nobody selected on", confirm_tasks),
    # 06 · Scaling
    ("06", r"(\d+) optimizer steps in smoke mode and (\d+) in the full run",
     lambda: (code_value("06", r"load_records\(kept\)\[: (\d+) if SMOKE") // 2,   # 2 ranks of batch 1
              code_value("06", r"load_records\(kept\)\[: \d+ if SMOKE else (\d+)\]") // 2)),
    ("06", r"(\d+)M parameters, ([\d.]+) GiB of fp32 weights, a LoRA adapter of ([\d.]+)M parameters",
     lambda: (memory("cpu-tiny").params / 1e6, memory("cpu-tiny").weights_gib, memory("cpu-tiny").trainable / 1e6)),
    ("06", r"4-bit weights \(~([\d.]+) GiB\)", lambda: memory("gpu-3b-qlora").weights_gib),
    ("06", r"cuts activations about ([\d.]+)x \(([\d.]+) to ([\d.]+) GiB",
     lambda: (lambda m: (m.activations_no_ckpt_gib / m.activations_ckpt_gib, m.activations_no_ckpt_gib,
                         m.activations_ckpt_gib))(memory("gpu-3b-qlora"))),
    ("06", r"— (\d+) x ([\d,]+) positions x",
     lambda: (preset("gpu-3b-qlora").sft.batch_size, preset("gpu-3b-qlora").sft.max_length)),
    ("06", r"fp32 copy and gradient, ([\d.]+) GiB \(`plan\(\.\.\., logits_chunk=None\)`\)",
     lambda: unchunked_logits_gib("gpu-3b-qlora")),
    ("06", r"the LM head runs ([\d,]+) positions at a time", lm_head_chunk),
    ("06", r"one chunk's ([\d.]+) GiB remains", lambda: memory("gpu-3b-qlora").logits_gib),
    ("06", r"`gen.kv_budget_gib = ([\d.]+)`: (\d+) rows of (\d+)k tokens",
     lambda: (preset("gpu-3b-qlora").gen.kv_budget_gib, memory("gpu-3b-qlora").rollout_batch,
              kv_row_k_tokens("gpu-3b-qlora"))),
    ("06", r"are ~(\d+) GiB before sharding", lambda: round(unsharded_state_gib("multinode-32b"), -1)),
    ("06", r"ZeRO-3 over (\d+) GPUs brings them to ~(\d+) GiB per GPU",
     lambda: (lambda gpus: (gpus, zero3_state_gib("multinode-32b", gpus)))(
         code_value("06", r"\"multinode-32b\": (\d+)\}"))),
    ("06", r"at the paper's 32k cutoff those two alone \(~(\d+) and ~(\d+) GiB\)",
     lambda: (lambda m: (m.logits_gib, m.activations_gib))(memory_at_length("multinode-32b", 32, 32 * 1024))),
    ("06", r"keeps trajectories to (\d+)k tokens \((\d+)k with the prompt",
     lambda: (preset("multinode-32b").gen.max_response_tokens / 1024, preset("multinode-32b").sft.max_length / 1024)),
    ("06", r"The plan runs from (\d+)% under to (\d+)% over the measured peaks", calibration_range),
    # 07 · Ablations (read here, owned by the lead)
    ("07", r"s \((\d+) minutes, Run 4 included\)", lambda: notebook_full_minutes("07")),
    ("07", r"Four RL runs of (\d+) steps x (\d+) questions x (\d+) samples",
     lambda: (lambda rl: (rl["steps"], rl["prompts_per_step"], rl["group_size"]))(
         code_value("07", r"rl=(\{\"steps\"[^}]*\})"))),
    ("07", r"from one seed of a (\d+)-epoch student", lambda: code_value("07", r"sft=\{\"epochs\": (\d+)\}")),
    ("07", r"a (\d+)-step warm-up", lambda: tiny().rl.warmup_steps),
    ("07", r"the last (\d+) tokens before the (\d+)-token limit",
     lambda: (tiny().rl.overlong_buffer, tiny().gen.max_response_tokens)),
    ("07", r"C = \\texttt\{rl\.tis\\_cap\} = ([\d.]+)", lambda: tiny().rl.tis_cap),
    ("07", r"TIS caps it at ([\d.]+)", lambda: tiny().rl.tis_cap),
]


# ---- comparing a stated number with its source ----

def _number(stated: str) -> float:
    word = stated.lower()
    if word in WORDS:
        return float(WORDS[word])
    return float(stated.replace(",", ""))


def agrees(stated: str, expected) -> bool:
    """`stated` as the lesson writes it ("87", "2,560", "2e-5", "three", "0.5") against its source's
    value, rounded to as many decimals as the lesson states (a string must be equal)."""
    if isinstance(expected, str):
        return stated == expected
    value = _number(stated)
    if "e" in stated.lower() and stated.lower() not in WORDS:  # 2e-5: as written, no rounding
        return math.isclose(value, expected, rel_tol=1e-9)
    decimals = len(stated.split(".")[1]) if "." in stated else 0
    return math.isclose(value, round(expected, decimals), rel_tol=1e-9, abs_tol=1e-12)


def disagreements(lesson: str, pattern: str, source) -> list[str]:
    matches = list(re.finditer(pattern, prose(lesson)))
    assert matches, f"notebook {lesson} no longer says {pattern!r}: reword the claim with the lesson"
    expected = source()
    expected = expected if isinstance(expected, tuple) else (expected,)
    problems = []
    for m in matches:
        assert len(m.groups()) == len(expected), (pattern, m.groups(), expected)
        for stated, value in zip(m.groups(), expected):
            if not agrees(stated, value):
                problems.append(f"notebook {lesson}: {m.group(0)!r} states {stated}, its source says {value!r}")
    return problems


@pytest.mark.parametrize("lesson, pattern, source", CLAIMS, ids=[f"{c[0]}:{c[1][:40]}" for c in CLAIMS])
def test_the_lessons_unlinked_numbers_match_their_source(lesson, pattern, source):
    problems = disagreements(lesson, pattern, source)
    assert not problems, "\n".join(problems)


def test_a_number_that_drifts_from_its_source_is_caught():
    assert agrees("87", 5199.9 / 60) and not agrees("60", 5199.9 / 60)   # "about an hour" would fail
    assert agrees("2.5", 2.5) and not agrees("12", 2.5)
    assert agrees("2e-5", 2e-5) and not agrees("1e-4", 2e-5)
    assert agrees("three", 3) and agrees("2,560", 2560) and agrees("1.45", 1.449) and not agrees("1.46", 1.449)
    assert agrees("cpu-tiny", "cpu-tiny") and not agrees("cpu-quick", "cpu-tiny")


def test_every_lesson_has_claims():
    lessons = sorted(p.name[:2] for p in NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    assert sorted({c[0] for c in CLAIMS}) == lessons
