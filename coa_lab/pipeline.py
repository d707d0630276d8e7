"""The five stages as functions that hand work to each other through files in one run folder.

    run/capture/traces.jsonl      every agent activation of every teacher run
    run/distill/kept.jsonl        CoA trajectories that survived the four filters (+ report)
    run/sft/adapter/              the observation-masked SFT adapter (+ losses)
    run/rl/adapter/, metrics.jsonl
    run/eval/{base,sft,rl}.json   per-suite metrics, and the trajectories behind them
    run/report.md, *.png          one table + plots

Each stage can run on its own (`coa-lab sft --run runs/x`) as long as its inputs exist; coa_lab/demo.py
runs them all in order (`coa-lab demo`) and resumes an interrupted demo.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import random
import shutil
import time
from pathlib import Path

import torch

from coa_lab import distributed, throughput
from coa_lab.capture import readout_cache
from coa_lab.capture.recorder import CaptureError, capture_runs, make_teacher, teacher_name
from coa_lab.capture.teacher import load_runs
from coa_lab.config import Preset
from coa_lab.distill.convert import run_to_coa
from coa_lab.distill.filters import progressive_filter
from coa_lab.distill.importers import load_imported
from coa_lab.evaluate import Readout, evaluate_readouts, greedy_temperature, save_eval, teacher_eval
from coa_lab.generation import engine_share, vllm_engine
from coa_lab.generation.backends import resolve_backend
from coa_lab.generation.llm import make_generator
from coa_lab.generation.models import load_tokenizer
from coa_lab.paths import DATASETS_DIR
from coa_lab.protocol import PROFILE_TOOLS
from coa_lab.rl.checkpoint import latest_rl_checkpoint
from coa_lab.rl.pool import PoolReport, select_pool
from coa_lab.rl.trainer import rl_seed, train_rl
from coa_lab.tasks.draws import by_benchmark, draw_tasks
from coa_lab.tasks.records import Task
from coa_lab.tools.registry import build_tools
from coa_lab.training.sft import train_sft
from coa_lab.trajectories import TrajectoryRecord, load_records, save_records

STAGES = ("capture", "distill", "sft", "rl", "control", "eval")


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, default=str))


def _read_json(path: Path):
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run the stage that writes it first (see `coa-lab --help`)")
    return json.loads(path.read_text())


def multi_hop_tasks(preset: Preset) -> list:
    """The capture's multi-hop share (capture.multi_hop_tasks), checked to be disjoint from the
    capture tasks and the RL pool candidates: the pool is read from the front of the same order."""
    c = preset.capture
    tasks = draw_tasks(preset, c.multi_hop_tasks, "train", from_end=True)
    front = {t.id for t in draw_tasks(preset, c.tasks, "train")}
    front |= {t.id for t in draw_tasks(preset, preset.rl.pool, "train", skip=c.tasks)}
    clash = [t.id for t in tasks if t.id in front]
    if clash:
        raise ValueError(f"capture.multi_hop_tasks meets the capture tasks or the RL pool ({clash[:3]}): the train "
                         "split is too small for all three; ask for fewer")
    return tasks


def _in_process_engine(preset: Preset) -> bool:
    """Whether the preset leaves vLLM's share open (an explicit gen.vllm_memory_fraction is the
    user's choice, in every stage) and its backend is a vLLM engine in this process."""
    if preset.gen.vllm_memory_fraction is not None or preset.gen.backend not in engine_share.IN_PROCESS_ENGINE:
        return False
    return resolve_backend(preset.gen.backend) == "vllm"


def _engine_share(preset: Preset) -> Preset:
    """RL: gen.vllm_memory_fraction for an engine beside the trainer (engine_share.with_engine_share:
    the numbers `coa-lab plan` shows); on vLLM's CPU build, which has no card to share, the KV cache
    of the rows gen.kv_budget_gib holds (engine_share.size_cpu_engine)."""
    if not _in_process_engine(preset):
        return preset
    engine_share.size_cpu_engine(preset, alone=False)
    return engine_share.with_engine_share(preset)


def _engine_alone(preset: Preset, model_name: str | None = None) -> Preset:
    """Capture and evaluation: gen.vllm_memory_fraction for an engine with the card to itself
    (engine_share.with_engine_alone), no trainer beside it, so it decodes several times RL's rows
    at once; on vLLM's CPU build the KV cache of gen.batch_size rows (engine_share.size_cpu_engine).
    model_name: the engine's model where not the preset's (a local teacher)."""
    if not _in_process_engine(preset):
        return preset
    engine_share.size_cpu_engine(preset, alone=True, model_name=model_name)
    return engine_share.with_engine_alone(preset, model_name)


def _free_the_card() -> None:
    """Shut down this process's vLLM engine (vllm_engine.release_engine; nothing to do without one)
    before a stage that trains, and before evaluation. Capture's engine holds most of the card
    (_engine_alone) until released, and the trainer needs it: SFT has the card alone, and RL makes
    its own engine at its share (_engine_share) before its trainer loads, so the two fit
    together as `coa-lab plan` sized them; evaluation's engine is asked for the card again, which
    RL's engine and trainer must have left."""
    vllm_engine.release_engine()
    # RL's trainer is garbage once train_rl returns, but PyTorch's allocator keeps its blocks
    # cached, and vLLM refuses to start when less than its share of the card is free.
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


def make_tools(preset: Preset):
    names = sorted({t for s in preset.suites for t in PROFILE_TOOLS[s]})
    return build_tools(names)


# ------------------------------------------------------------------------------- stages


def capture(preset: Preset, run: Path, resume: bool = True) -> dict:
    """The teacher on the capture tasks, appended run by run to capture/traces.jsonl; on a
    folder that already has traces it resumes (capture/recorder.py): every task exactly once.
    A local teacher's engine has the card alone (_engine_alone); SFT and RL release it."""
    if not preset.capture.teacher_url:  # a remote teacher's model may have no shape here, and needs no share
        preset = _engine_alone(preset, preset.capture.teacher_model)

    c = preset.capture
    tasks = draw_tasks(preset, c.tasks, "train")
    multi = multi_hop_tasks(preset) if c.multi_hop_tasks else []  # checked before any capture work
    backend = make_teacher(preset)
    traces = run / "capture" / "traces.jsonl"
    tools = make_tools(preset)
    result = capture_runs(backend, tasks, tools, preset, traces, resume=resume)
    if multi:  # their own lockstep batches: the one-hop runs are the same with or without them
        two_hop = dataclasses.replace(preset, capture=dataclasses.replace(c, max_hops=c.multi_hop_hops))
        more = capture_runs(backend, multi, tools, two_hop, traces, resume=True)
        result = dataclasses.replace(more, resumed=result.resumed, captured=result.captured + more.captured,
                                     seconds=round(result.seconds + more.seconds, 1),
                                     dropped_torn_line=result.dropped_torn_line or more.dropped_torn_line)
    runs = result.runs
    if runs and all(r.error for r in runs):  # nothing to distill: a teacher that never answered
        where = c.teacher_url or teacher_name(preset)
        raise CaptureError(f"all {len(runs)} teacher runs failed ({where}; first: {runs[0].error[:200]}). "
                           f"Fix the teacher (capture.teacher_url, its key in ${c.teacher_api_key_env}) "
                           f"and run capture again: failed runs are retried")
    one_hop = {t.id for t in tasks}
    key_of = {t.id: key for key, ts in by_benchmark(tasks, c.tasks).items() for t in ts}
    summary = {"runs": len(runs), "activations": sum(len(r.activations) for r in runs),
               "tool_calls": sum(r.tool_calls for r in runs), "seconds": result.seconds,
               "teacher": teacher_name(preset), "resumed": result.resumed, "captured": result.captured,
               "failed": result.failed, "dropped_torn_line": result.dropped_torn_line,
               # on the capture tasks (max_hops): tokens, agent calls and tool calls per task and
               # per success, overall and per benchmark
               "success": teacher_eval([r for r in runs if r.task_id in one_hop], key_of),
               # the teacher's generated tokens over the capture's time (a resumed capture's time is its own part only)
               "generated": throughput.rates({"rollouts": len(runs), "tokens": sum(
                   a.completion_tokens for r in runs for a in r.activations)}, None if result.resumed else result.seconds)}
    if multi:
        ids = {t.id for t in multi}
        mkey = {t.id: key for key, ts in by_benchmark(multi, c.multi_hop_tasks).items() for t in ts}
        summary["multi_hop"] = {"hops": c.multi_hop_hops, "tasks": len(multi),
                                "success": teacher_eval([r for r in runs if r.task_id in ids], mkey)}
    if hasattr(backend, "retries"):
        summary["requests"], summary["retries"] = backend.requests, backend.retries
    if getattr(backend, "stats", None):  # a local teacher: prompt tokens sent vs really prefilled
        summary.update(backend.stats)
    write_json(run / "capture" / "summary.json", summary)
    return summary


def distill(preset: Preset, run: Path) -> dict:
    """Convert teacher runs (and the shipped real trajectories) to CoA, then filter."""
    t0 = time.time()
    runs = load_runs(run / "capture" / "traces.jsonl")
    records, tasks_by_id = [], {}
    for r in runs:
        # the multi-hop share is its own row of the funnel (capture.multi_hop_tasks)
        source = "teacher" if r.hops in (None, preset.capture.max_hops) else f"teacher-{r.hops}hop"
        tasks_by_id[r.task_id] = Task(r.task_id, r.question, r.answers, "teacher", r.profile, {})
        records.append(TrajectoryRecord(f"teacher-{r.task_id}", r.task_id, source, r.profile, r.question,
                                        r.answers, run_to_coa(r), metadata={"teacher_tokens": r.tokens}))
    n_imp = preset.distill.imported_per_suite
    if n_imp > 0:
        for path in sorted((DATASETS_DIR / "trajectories").glob("*.jsonl")):
            imported = [i for i in load_imported(path)
                        if i.profile in preset.suites and i.source in preset.distill.imported_sources]
            random.Random(preset.seed).shuffle(imported)  # files are not ordered by kind
            for imp in imported[:n_imp]:
                tid = f"{imp.source}-{imp.task_id}"
                tasks_by_id[tid] = Task(tid, imp.question, list(imp.gold), imp.source, imp.profile, {})
                records.append(TrajectoryRecord(tid, tid, imp.source, imp.profile, imp.question, list(imp.gold), imp.text))
    tokenizer = load_tokenizer(preset.model.name)
    kept, report = progressive_filter(
        records, tasks_by_id, lambda t: len(tokenizer(t, add_special_tokens=False)["input_ids"]),
        preset.distill.min_tool_calls, preset.distill.max_tool_calls, preset.distill.max_trajectory_tokens,
    )
    save_records(records, run / "distill" / "all.jsonl")
    save_records(kept, run / "distill" / "kept.jsonl")
    summary = {"input": len(records), "kept": len(kept), "by_source": report.counts,
               "kept_by_source": _count(r.source for r in kept), "dropped_by_reason": report.by_reason(),
               "seconds": round(time.time() - t0, 1)}
    write_json(run / "distill" / "summary.json", summary)
    write_json(run / "distill" / "dropped.json", report.dropped)
    (run / "distill" / "filter_table.md").write_text(report.table() + "\n")
    return summary


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def sft(preset: Preset, run: Path, resume: bool = False) -> dict:
    """Masked SFT on distill/kept.jsonl. Under `accelerate launch` every rank runs this and
    transformers' Trainer splits the batches (coa_lab/distributed.py); rank 0 writes the files."""
    t0 = time.time()
    records = load_records(run / "distill" / "kept.jsonl")
    _free_the_card()
    result = train_sft(preset, records, run / "sft", resume=resume)
    summary = {"examples": result.n_examples, "losses": result.losses, "first_loss": result.losses[0],
               "last_loss": result.losses[-1], "trained_tokens": result.trained_tokens,
               "masked_observation_tokens": result.masked_observation_tokens, "seconds": round(time.time() - t0, 1)}
    if distributed.is_main():
        write_json(run / "sft" / "summary.json", summary)
    return summary


def rl(preset: Preset, run: Path, resume: bool = False, reuse_pool: bool = False) -> dict:
    """Pool screening, then DAPO. `reuse_pool`: train on the screening already in rl/pool.json
    (benchmarks/bench_rl_seeds.py screens once and varies only RL's own randomness after)."""
    _free_the_card()  # an engine left by capture (or another share) is never the one RL was planned with
    preset = _engine_share(preset)

    t0, generated = time.time(), throughput.mark()
    # Under `accelerate launch` every rank runs this stage: they screen the pool together
    # (each its share of the samples) and train data-parallel; rank 0 writes the files.
    distributed.init()
    distributed.require_replicated_policy("RL")
    # Fresh training questions (the capture tasks are skipped), screened by the SFT policy's
    # own pass rate: the paper keeps queries the model solves sometimes but not always.
    candidates = draw_tasks(preset, preset.rl.pool, "train", skip=preset.capture.tasks)
    adapter = run / "sft" / "adapter"
    adapter = adapter if adapter.exists() else None
    tools = make_tools(preset)
    r = preset.rl
    saved = run / "rl" / "pool.json"
    reused_fallback = False  # a reused screening that had fallen back keeps saying so
    if saved.exists() and (reuse_pool or (resume and latest_rl_checkpoint(run / "rl") is not None)):
        # the interrupted run's screening, not a new one: a resumed run trains on the same pool
        old = json.loads(saved.read_text())
        report = PoolReport(old["candidates"], old["samples"], old["kept"], old["pass_rates"], old["histogram"],
                            rollouts=old.get("rollouts"))  # the count the screening drew, kept when it is rewritten
        pool = [t for t in candidates if t.id in set(old["pool"])]
        reused_fallback = bool(old.get("fallback_to_all_candidates"))
    else:
        torch.manual_seed(rl_seed(preset))  # the screening samples are RL's randomness too
        pool, report = select_pool(make_generator(preset, adapter), candidates, tools, preset)
    fallback = reused_fallback or len(pool) < r.prompts_per_step
    if fallback:  # too few mixed-outcome questions: train on every candidate, and say so
        pool = candidates
    anchors = [t for t in candidates if report.pass_rates[t.id] == 1.0]  # solved every time
    if distributed.is_main():
        write_json(run / "rl" / "pool.json", {**report.to_dict(), "fallback_to_all_candidates": fallback,
                                              "anchors": [t.id for t in anchors], "pool": [t.id for t in pool]})
    screen_seconds = round(time.time() - t0, 1)
    sft_records = None
    if r.sft_coef > 0:  # the SFT set, mixed into every update (rl.sft_coef, PPO-ptx)
        kept = run / "distill" / "kept.jsonl"
        if not kept.exists():
            raise FileNotFoundError(f"{kept} is missing: rl.sft_coef > 0 mixes the SFT trajectories into RL; "
                                    "run the distill stage first, or set rl.sft_coef=0")
        sft_records = load_records(kept)
    result = train_rl(preset, pool, tools, run / "rl", adapter=adapter, anchors=anchors, resume=resume,
                      sft_records=sft_records)
    summary = {"steps": len(result.metrics), "metrics": result.metrics, "pool": len(pool), "anchors": len(anchors),
               "pool_candidates": len(candidates), "pool_histogram": report.histogram,
               "pool_rollouts": report.rollouts,
               "pool_fallback": fallback, "pool_seconds": screen_seconds, "seconds": round(time.time() - t0, 1)}
    summary["generated"] = throughput.since(generated, summary["seconds"])  # screening's rollouts and training's
    if distributed.is_main():
        write_json(run / "rl" / "summary.json", summary)
    return summary


def new_rl_run(folder: Path, adapter: Path, distill: Path, pool: Path) -> None:
    """A fresh run folder whose RL stage starts from `adapter` (linked as sft/adapter), mixes in the SFT rows
    of `distill` when there are any (rl.sft_coef), and trains on the screened `pool` when given: what RL's
    control and every `coa-lab arms` run train from. Whatever the folder held before is removed."""
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "sft").mkdir(parents=True)
    (folder / "sft" / "adapter").symlink_to(adapter.resolve())
    if distill.exists():
        (folder / "distill").symlink_to(distill.resolve())
    if pool.exists():
        (folder / "rl").mkdir()
        shutil.copy(pool, folder / "rl" / "pool.json")


def control(preset: Preset, run: Path) -> dict:
    """RL's control (eval.control): the RL stage again from the same SFT adapter with the policy gradient
    off: the same steps, SFT rows and seed at eval.control_learning_rate, nothing sampled, in RUN/control.
    Why: a gain over SFT may be only more SFT (and where RL's updates mix the SFT loss in, rl.sft_coef,
    RL − SFT counts that extra SFT as RL's); RL − control does not."""
    if not preset.eval.control:
        return {}
    for needed in (run / "sft" / "adapter", run / "rl" / "pool.json"):
        if not needed.exists():
            raise FileNotFoundError(f"{needed} is missing: the control starts from the SFT adapter and trains on "
                                    "RL's own pool; run the sft and rl stages first")
    folder = run / "control"
    distributed.init()
    if distributed.is_main():  # under `accelerate launch` every rank runs this stage: one sets the folder up
        # a stale control would pair with another RL run; RL's own screening: the same pool and anchors
        new_rl_run(folder, run / "sft" / "adapter", run / "distill", run / "rl" / "pool.json")
    distributed.barrier()
    # the recipe without its policy gradient; a recipe with no SFT mix is held against the SFT loss on its rows
    rate = preset.eval.control_learning_rate or preset.rl.learning_rate
    rl_off = dataclasses.replace(preset.rl, pg_coef=0.0, sft_coef=preset.rl.sft_coef or 1.0, learning_rate=rate)
    return rl(dataclasses.replace(preset, rl=rl_off), folder, reuse_pool=True)


# where each evaluated system's adapter lies in a run folder (base: none)
ADAPTERS = {"sft": "sft/adapter", "rl": "rl/adapter", "control": "control/rl/adapter"}
SAMPLED = ("sft", "control", "rl")  # read at rl.temperature beside greedy when RL has its control (eval.control)


def evaluate_stage(preset: Preset, run: Path, which: tuple[str, ...] = ("base", "sft", "rl", "control"),
                   resume: bool = False) -> dict:
    """Base / SFT / RL single models on the held-out mix, and the multi-agent teacher on the
    headline (learnable) tasks: the paper's cost comparison on the same tasks. No trainer is on
    the card: RL's engine (planned beside a trainer) is released and evaluation's has the card alone.
    Each system's readout is kept in RUN/eval/done/<system>.json as it finishes; `resume` reads them again
    (a cut evaluation loses only the system it was on); a fresh one clears them (an adapter may be new)."""
    _free_the_card()
    teacher_preset = preset if preset.capture.teacher_url else _engine_alone(preset, preset.capture.teacher_model)
    preset = _engine_alone(preset)

    t0, generated = time.time(), throughput.mark()
    done = run / "eval" / "done"
    if not resume:
        shutil.rmtree(done, ignore_errors=True)
    # the test split is what the report quotes; validation (eval.val_tasks) is where settings are
    # chosen, and is evaluated beside it so a tuning run reads val, never test
    groups = by_benchmark(draw_tasks(preset, preset.eval.tasks, "test"), preset.eval.tasks)
    val_groups = by_benchmark(draw_tasks(preset, preset.eval.val_tasks, "val"), preset.eval.val_tasks)
    tools = make_tools(preset)
    headline = {key: groups[key] for key in preset.eval.headline if key in groups}
    k = preset.eval.control_samples if preset.eval.control and (run / ADAPTERS["control"]).exists() else 0
    out, seconds, val, sampled = {}, {}, {}, {}  # seconds per evaluated system: where the stage's time goes
    earlier = 0.0  # the seconds of the systems read back from RUN/eval/done: the stage's own time counts them
    for label in which:
        adapter = run / ADAPTERS[label] if label in ADAPTERS else None
        if (adapter is not None and not adapter.exists()) or (label == "control" and not preset.eval.control):
            continue  # a control left by an earlier run is not this run's
        kept, again = _kept_or(done / f"{label}.json", lambda: _evaluate_system(
            preset, label, adapter, (groups, val_groups, headline), tools, k if label in SAMPLED else 0, run))
        out[label], seconds[label] = kept["test"], kept["seconds"]
        earlier += kept["seconds"] if again else 0.0
        if "val" in kept:
            val[label] = kept["val"]
        if "sampled" in kept:
            sampled[label] = kept["sampled"]
    if val:
        out["val"] = val
    if sampled:
        out["sampled"] = {"samples": k, "temperature": preset.rl.temperature, **sampled}
    if preset.eval.teacher:
        kept, again = _kept_or(done / "teacher.json",
                               lambda: _evaluate_teacher(teacher_preset, preset, run, groups, tools))
        out.update({key: v for key, v in kept.items() if key != "seconds"})
        seconds["teacher"] = kept["seconds"]
        earlier += kept["seconds"] if again else 0.0
    out["seconds_by_system"] = seconds
    # the students' rollouts this start generated, over this start's time (systems read back cost neither)
    out["generated"] = throughput.since(generated, time.time() - t0, across_ranks=False)
    out["seconds"] = round(time.time() - t0 + earlier, 1)
    write_json(run / "eval" / "summary.json", out)
    return out


def _kept_or(path: Path, evaluate_it) -> tuple[dict, bool]:
    """The readout kept at `path` (and True), else evaluate_it()'s, kept there as soon as it is done."""
    if path.exists():
        try:
            return json.loads(path.read_text()), True
        except json.JSONDecodeError:  # torn by a kill mid-write: that system is read again
            pass
    result = evaluate_it()
    write_json(path, result)
    return result, False


def _evaluate_system(preset: Preset, label: str, adapter: Path | None, task_groups: tuple, tools, k: int,
                     run: Path) -> dict:
    """One system (base or an adapter), every readout in one pass (evaluate_readouts): greedy on the
    test mix and on validation, and k samples at RL's temperature on the headline tasks (k > 0: RL
    against its control, where sharpening shows). The base model reads the test mix only: it scores
    0.00 without SFT in every published run, so its validation would choose nothing."""
    groups, val_groups, headline = task_groups
    t1 = time.time()
    k1 = preset.eval.samples
    greedy = Readout(groups, k1, greedy_temperature(preset, k1))
    readouts = {label: greedy}
    if val_groups and label != "base":
        readouts[f"val_{label}"] = dataclasses.replace(greedy, tasks_by_suite=val_groups)
    if k:
        readouts[f"sampled_{label}"] = Readout(headline, k, preset.rl.temperature)
    torch.manual_seed(preset.seed)  # the policy RL trains is the sampled one: the same draws for every adapter
    results = evaluate_readouts(make_generator(preset, adapter), readouts, tools, preset)
    kept = {}
    for key, result in results.items():
        save_eval(result, run / "eval")
        kept[{label: "test", f"val_{label}": "val", f"sampled_{label}": "sampled"}[key]] = result.summary()
    return {**kept, "seconds": round(time.time() - t1, 1)}


def _evaluate_teacher(teacher_preset: Preset, preset: Preset, run: Path, groups: dict, tools) -> dict:
    """The multi-agent teacher on the headline tasks: the cost the single CoA model is compared with.
    Read back where the same inputs were read before (capture/readout_cache.py)."""
    t1 = time.time()
    tasks = [t for key in preset.eval.headline for t in groups.get(key, [])]
    runs_file = run / "eval" / "teacher_runs.jsonl"
    key = readout_cache.readout_key(teacher_preset, tasks, tools.names())
    kept = readout_cache.load(key, runs_file)
    if kept is not None:
        return kept
    teacher = make_teacher(teacher_preset)  # a larger teacher's engine is sized for its own weights
    runs = capture_runs(teacher, tasks, tools, preset, runs_file, resume=False).runs
    kept = {"teacher": teacher_eval(runs, {t.id: key for key in preset.eval.headline for t in groups.get(key, [])})}
    if getattr(teacher, "stats", None):  # a local teacher: prompt tokens sent vs really prefilled
        kept["teacher_prompt_tokens"] = dict(teacher.stats)
    kept["seconds"] = round(time.time() - t1, 1)
    readout_cache.store(key, kept, runs_file)
    return kept
