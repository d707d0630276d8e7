"""Whether a preset's data can feed its recipe, checked in seconds before any stage starts.

A preset can be wrong in ways that show only hours in: a train split too small for both the capture
tasks and the RL pool drawn after them (`draw_tasks(..., skip=capture.tasks)`) leaves RL an empty pool
after capture and SFT have finished. `data_problems` reads the preset's data the way the stages will
and returns every such problem as a sentence:

- every task mix (capture, its multi-hop share, the RL pool, test and validation) draws as many tasks
  as it asks for from its split;
- the RL pool has at least one step's questions, and the tasks capture, the multi-hop share and the
  pool use are pairwise disjoint and meet no test or validation task (by id and by question text);
- the files the preset names exist (imported trajectories; the launch configs of a multi-node preset).

`coa-lab demo` runs them first (`require_runnable`); `coa-lab plan` prints them; whether the preset's
memory plan fits the card it is sized for is coa_lab/planning/preset_check.py's.
"""

from __future__ import annotations

from coa_lab.config import Preset
from coa_lab.paths import DATASETS_DIR, PROJECT_ROOT
from coa_lab.tasks.draws import draw_tasks
from coa_lab.tasks.records import DatasetError
from coa_lab.tasks.scorers import normalize_answer

# files a preset's stages read besides datasets/: a multi-node preset is started by its launch script
LAUNCH_FILES = {"multinode-32b": ("configs/zero3.yaml", "configs/ddp.yaml", "configs/slurm/multinode_32b.sbatch")}
IMPORTED_FILES = {"fireact": "fireact_hotpotqa_react.jsonl", "r1searcher": "r1searcher_hotpotqa_qwen.jsonl",
                  "tora": "tora70b_gsm8k.jsonl"}


class PresetError(ValueError):
    """A preset whose recipe cannot run as written (the message lists every reason)."""


def _draw(preset: Preset, mix: dict[str, int], split: str, problems: list[str], what: str, **kw) -> list:
    """draw_tasks as the stage calls it, with a short draw or a missing file as a problem."""
    tasks = []
    for key, n in mix.items():
        try:
            got = draw_tasks(preset, {key: n}, split, skip={key: (kw.get("skip") or {}).get(key, 0)},
                             from_end=kw.get("from_end", False))
        except (DatasetError, FileNotFoundError, ValueError) as exc:
            problems.append(f"{what} {key}: cannot load the {split} split ({exc})")
            continue
        if len(got) < n:
            skipped = (kw.get("skip") or {}).get(key, 0)
            after = f" after the {skipped} capture uses" if skipped else ""
            problems.append(f"{what} {key}: asks for {n} {split} tasks, the split has {len(got)}{after}")
        tasks += got
    return tasks


def _question(task) -> str:
    return normalize_answer(task.question)


def _overlaps(named: dict[str, list], problems: list[str]) -> None:
    """Each pair of task sets that shares an id or a question (normalized) is a problem."""
    names = list(named)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ids = {t.id for t in named[a]} & {t.id for t in named[b]}
            questions = {_question(t) for t in named[a]} & {_question(t) for t in named[b]}
            if ids or questions:
                example = sorted(ids)[:2] or sorted(questions)[:1]
                problems.append(f"{a} and {b} share {max(len(ids), len(questions))} task(s), e.g. {example}")


def data_problems(preset: Preset) -> list[str]:
    """Every reason the preset's data cannot feed its stages (an empty list: it can)."""
    problems: list[str] = []
    c, r, e = preset.capture, preset.rl, preset.eval
    capture = _draw(preset, c.tasks, "train", problems, "capture.tasks")
    multi = _draw(preset, c.multi_hop_tasks, "train", problems, "capture.multi_hop_tasks", from_end=True)
    pool = _draw(preset, r.pool, "train", problems, "rl.pool", skip=c.tasks)
    test = _draw(preset, e.tasks, "test", problems, "eval.tasks")
    val = _draw(preset, e.val_tasks, "val", problems, "eval.val_tasks")
    if len(pool) < r.prompts_per_step:
        problems.append(f"rl.pool draws {len(pool)} task(s) after capture, fewer than one step's "
                        f"rl.prompts_per_step={r.prompts_per_step}: RL would find its pool empty")
    _overlaps({"capture": capture, "the multi-hop share": multi, "the RL pool": pool, "the test split": test,
               "the validation split": val}, problems)
    missing_headline = [k for k in e.headline if k not in e.tasks]
    if missing_headline:
        problems.append(f"eval.headline names {missing_headline}, which eval.tasks does not evaluate")
    for source in (preset.distill.imported_sources if preset.distill.imported_per_suite > 0 else ()):
        path = DATASETS_DIR / "trajectories" / IMPORTED_FILES.get(source, f"{source}.jsonl")
        if source not in IMPORTED_FILES or not path.exists():
            problems.append(f"distill.imported_sources names {source!r}, whose file is not shipped")
    for rel in LAUNCH_FILES.get(preset.name, ()):
        if not (PROJECT_ROOT / rel).exists():
            problems.append(f"{rel} is missing: the {preset.name} recipe is launched with it")
    return problems


def require_runnable(preset: Preset) -> None:
    """Raise PresetError naming every data problem, before any stage spends time (`coa-lab demo`)."""
    problems = data_problems(preset)
    if problems:
        raise PresetError(f"preset {preset.name!r} cannot run its recipe:\n- " + "\n- ".join(problems))
