"""Stage 4, DAPO RL: multi-turn rollouts that execute real tools, a binary verifiable reward,
observation tokens masked out of the loss.

One step:
1. draw prompts; roll out `group_size` trajectories each (student_rollout.run_coa: tools run);
2. reward = the task's scorer on the final answer (the same function evaluation uses),
   plus DAPO's soft overlong punishment;
3. dynamic sampling: drop groups with all-equal rewards, draw fresh prompts to refill
   (up to `max_sampling_rounds` extra draws);
4. GRPO advantages within each group;
5. old log-probs (for the mini-batches after the first), then `mini_batches` optimizer
   steps with the clip-higher, token-level loss. Mask = policy tokens only (prompt,
   observations, padding and, with overlong filtering, truncated samples get 0). A
   mini-batch is whole groups, and each forward packs one group's samples in one row
   (coa_lab/training/packing.py): their shared prompt is computed once, no padding at all.

Where each part lives: sampling and scoring (1-3) in rl/rollouts.py, the update (4-5) in
rl/update.py, checkpoints and the resumable task streams in rl/checkpoint.py; this module is
the loop that runs them and writes the run folder.

Switches beyond DAPO, off unless a preset sets them: a KL term to the SFT policy (rl.kl_coef)
and the SFT loss mixed into each step (rl.sft_coef, InstructGPT's PPO-ptx).
Simplifications, on purpose: no critic (as DAPO); one pass over each batch;
sampling and training share one process (on GPU the vLLM generator swaps in the adapter).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from coa_lab import distributed
from coa_lab.config import Preset
from coa_lab.generation.backends import resolve_backend, rollout_batch
from coa_lab.generation.hf_generator import HFGenerator
from coa_lab.generation.llm import rl_sampler
from coa_lab.generation.models import compute_context, grad_scaler, load_model
from coa_lab.progress import progress_bar
from coa_lab.rl import dapo, optim
from coa_lab.rl.checkpoint import CountedStream, TaskCycle, latest_rl_checkpoint, restore_run, save_checkpoint
from coa_lab.rl.int8_rollouts import Int8Rollouts
from coa_lab.rl.pool import anchor_stream
from coa_lab.rl.reference import ReferenceWeights
from coa_lab.rl.rollouts import collect_batch
from coa_lab.rl.update import policy_update, sft_only_update
from coa_lab.student_rollout import Rollout
from coa_lab.training.compiled_layers import compiled_layers
from coa_lab.training.sft import encode_example, record_messages
from coa_lab.trajectories import TrajectoryRecord, save_records


@dataclass
class RLResult:
    adapter_dir: Path
    metrics: list[dict] = field(default_factory=list)


def _record(r: Rollout, accuracy: float, shaped: float, step: int, n: int) -> TrajectoryRecord:
    return TrajectoryRecord(
        id=f"rl-{step}-{n}", task_id=r.task.id, source="rl", profile=r.task.profile,
        question=r.task.question, answers=list(r.task.answers), text=r.text, reward=accuracy,
        n_tokens=len(r.response_ids), n_tool_calls=r.tool_calls,
        metadata={"step": step, "shaped_reward": shaped, "finish": r.finish, "truncated": r.truncated,
                  "policy_tokens": r.policy_tokens},  # n_tokens counts observation tokens too
    )


def rl_seed(preset: Preset) -> int:
    """The seed of RL's randomness: `rl.seed`, or the preset's when unset."""
    return preset.seed if preset.rl.seed is None else preset.rl.seed


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def check_logprob_identity(preset: Preset) -> None:
    """Refuse settings under which the trainer's log-prob of a sampled token is not the
    sampler's: the ratio, the clipping and the TIS weights all assume they are one function."""
    if preset.gen.top_p < 1:  # the sampler draws from a renormalised nucleus the trainer never scores
        raise ValueError(f"RL samples from the full distribution the trainer scores, but gen.top_p={preset.gen.top_p} "
                         "truncates it; set gen.top_p=1.0")
    if preset.model.lora_dropout > 0:  # the trained forward drops units the sampler's forward kept
        raise ValueError(f"RL needs the trainer's forward to be the sampler's, but model.lora_dropout="
                         f"{preset.model.lora_dropout} randomises it; set model.lora_dropout=0.0")


def check_settings(preset: Preset, sft_records) -> None:
    """Refuse RL settings that cannot run, with the fix, before a model is loaded."""
    check_logprob_identity(preset)
    rl = preset.rl
    if rl.rollout_int8 not in (False, True, "all", "attention"):
        raise ValueError(f"rl.rollout_int8 must be false, true ('all': every Linear) or 'attention' (q/k/v/o only), "
                         f"got {rl.rollout_int8!r}")
    if rl.kl_coef < 0:
        raise ValueError(f"rl.kl_coef must be >= 0 (0 turns the KL term off), got {rl.kl_coef}")
    if rl.sft_coef < 0:
        raise ValueError(f"rl.sft_coef must be >= 0 (0 turns the SFT mix off), got {rl.sft_coef}")
    if rl.pg_coef < 0:
        raise ValueError(f"rl.pg_coef must be >= 0 (0: the SFT-only control), got {rl.pg_coef}")
    optim.check_schedule(rl)
    if rl.advantage not in dapo.ADVANTAGES:
        raise ValueError(f"rl.advantage must be one of {dapo.ADVANTAGES}, got {rl.advantage!r}")
    if rl.pg_coef == 0 and rl.sft_coef == 0:
        raise ValueError("rl.pg_coef=0 (the SFT-only control) with rl.sft_coef=0 trains nothing; set rl.sft_coef > 0")
    if rl.sft_coef > 0 and not sft_records:
        raise ValueError("rl.sft_coef > 0 mixes the SFT loss into RL, but no SFT trajectories were given "
                         "(distill/kept.jsonl); set rl.sft_coef=0 or run the distill stage first")


def train_rl(preset: Preset, train_tasks: list, tools, out_dir: str | Path, adapter: str | Path | None = None,
             generator_factory=None, anchors: list | None = None, resume: bool = False, on_step=None,
             sft_records: list[TrajectoryRecord] | None = None) -> RLResult:
    """Run `preset.rl.steps` DAPO steps from `adapter` (the SFT output) on `train_tasks`;
    `anchors` (questions the SFT policy always solved) are sampled beside them, see collect_batch.

    Every `rl.save_steps` steps out_dir/checkpoint holds the adapter, the optimizer state, the
    step, the RNG states and how far the task streams got; resume=True continues from it (the
    metrics and sampled rollouts before it are kept) and is a fresh start when there is none.
    on_step(step, row, model): called on every rank after each step (a live plot, a test's probe).
    sft_records: the SFT set (distill/kept.jsonl), needed when rl.sft_coef > 0: each optimizer
    step adds rl.sft_coef x the masked SFT loss on rl.sft_rows of them, drawn in turn (PPO-ptx).

    Under `accelerate launch` (configs/ddp.yaml) every rank runs this function: they draw the
    same tasks, each rolls out its share, and the update's gradient is summed over the ranks
    (coa_lab/distributed.py); rank 0 writes the files."""
    check_settings(preset, sft_records)  # before anything is loaded: a refused run costs nothing
    if not train_tasks:
        raise ValueError("RL needs training tasks; the pool is empty")
    distributed.init()  # under `accelerate launch`: join the ranks (a no-op in one process)
    distributed.require_replicated_policy("RL")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    run = _start_run(preset, out_dir, adapter, resume, generator_factory, sft_records)
    pool_ids = {t.id for t in train_tasks}
    pool_iter = TaskCycle(list(train_tasks))
    anchor_iter = (CountedStream(anchor_stream(list(anchors), rl_seed(preset)))
                   if anchors and preset.rl.anchors_per_step > 0 else None)
    metrics, sampled, first_step = [], [], 0
    if run.state is not None:  # continue exactly where the checkpoint left off
        metrics, sampled, first_step = restore_run(run.state, out_dir, run.optimizer, pool_iter, anchor_iter,
                                                   run.sft_iter)
        optim.restore_schedule(run.scheduler, run.state, preset.rl)
    # delta_norm's origin: the run's first weights (the KL reference's copy when there is one)
    state = run.state
    start = optim.StartWeights(run.model, (state.get("start") or state.get("reference")) if state is not None else None)
    seen = {r.task_id for r in sampled} & pool_ids  # pool questions sampled in earlier steps
    main = distributed.is_main()
    # rank 0 writes the run folder; the other ranks compute the same rows and keep them in memory
    with open(out_dir / "metrics.jsonl" if main else os.devnull, "w") as log, \
            progress_bar(total=preset.rl.steps, initial=first_step, desc="rl", unit="step", disable=not main) as bar:
        for row in metrics:
            log.write(json.dumps(row) + "\n")
        for step in range(first_step, preset.rl.steps):
            t0 = time.time()
            row, groups, postfix = _rl_step(preset, run, step, pool_iter, anchor_iter, tools, sampled, seen, pool_ids,
                                            out_dir, main)
            row.update(delta_norm=start.delta_norm(), **optim.lr_scales(run.scheduler))  # drift vs noise: docs/design.md
            row["seconds"] = round(time.time() - t0, 1)
            row["sample_seconds"] = row.pop("sample_seconds")  # beside `seconds`: the rest of it is the update
            metrics.append(row)
            bar.update(1)
            bar.set_postfix(**postfix)
            log.write(json.dumps(row) + "\n")
            log.flush()
            if on_step is not None:
                on_step(step, row, run.model)
            _save_step(preset, run, out_dir, step, groups, sampled, pool_iter, anchor_iter, start, main)
    distributed.barrier()  # rank 0's files are complete before any rank returns
    return RLResult(out_dir / "adapter", metrics)


@dataclass
class _Run:
    """What an RL run holds between steps: the policy and how it samples and learns."""
    model: object
    tokenizer: object
    compute: object  # the forward's numerics context, the same for sampling and training
    scaler: object  # fp16's loss scaler (a pass-through elsewhere)
    generator: object
    optimizer: object
    scheduler: object
    reference: object  # the KL term's SFT weights (rl.kl_coef > 0), else None
    sft_iter: TaskCycle | None  # PPO-ptx's SFT rows, drawn in turn
    encoded: dict  # those rows encoded, by record id
    state: dict | None  # the checkpoint resumed from


def _start_run(preset: Preset, out_dir: Path, adapter, resume: bool, generator_factory, sft_records) -> _Run:
    """Seeds, the policy (from the checkpoint when resuming), its sampler, the optimizer, the KL
    reference and the SFT rows: everything in the order a fixed seed reproduces."""
    rl, seed = preset.rl, rl_seed(preset)
    random.seed(seed)  # the same on every rank: they draw the same tasks, in the same order
    torch.manual_seed(seed)  # the same LoRA initialisation on every rank ...
    checkpoint = latest_rl_checkpoint(out_dir) if resume else None
    state = torch.load(checkpoint / "state.pt", weights_only=False) if checkpoint else None
    start_adapter = checkpoint / "adapter" if checkpoint else adapter
    model, tokenizer = load_model(preset.model, adapter=start_adapter, trainable=True)
    if distributed.world_size() > 1:  # ... but each rank samples its own rollouts
        torch.manual_seed(seed + 1000 * distributed.rank())
    compute = lambda: compute_context(model, preset.model)  # noqa: E731 - same numerics for sampling and training
    generator = _sampler(preset, model, tokenizer, compute, generator_factory, start_adapter)
    optimizer, scheduler = optim.build_optimizer([p for p in model.parameters() if p.requires_grad], rl)
    reference = None
    if rl.kl_coef > 0:  # the SFT adapter's weights: this run's start, or the checkpoint's copy of them
        if state is not None and state.get("reference") is None:
            raise ValueError("rl.kl_coef > 0, but the checkpoint was written without a KL reference; "
                             "resume with the settings the run started with (rl.kl_coef=0)")
        reference = ReferenceWeights(model, state["reference"] if state is not None else None)
    encoded, sft_iter = {}, None
    if rl.sft_coef > 0:
        encoded = {rec.id: encode_example(tokenizer, record_messages(rec), rec.text, preset.sft.max_length,
                                          mask_observations=preset.sft.mask_observations) for rec in sft_records}
        # its own RNG: the control arm, which samples nothing, draws the rows the recipe draws
        sft_iter = TaskCycle(list(sft_records), rng=random.Random(seed))
    return _Run(model, tokenizer, compute, grad_scaler(model, preset.model), generator, optimizer, scheduler,
                reference, sft_iter, encoded, state)


def _sampler(preset: Preset, model, tokenizer, compute, generator_factory, adapter):
    """Who samples the rollouts: a test's factory, vLLM (the adapter on disk, pushed after each
    update), an int8 copy of the policy (rebuilt after every update; TIS corrects the loss), or
    the policy itself (always the current weights)."""
    if generator_factory is not None:
        return generator_factory(model, tokenizer)
    if preset.rl.pg_coef == 0:  # the SFT-only control samples nothing: no engine to start (vLLM's takes a card share)
        return None
    if resolve_backend(preset.gen.backend) in ("vllm", "vllm-server"):
        return rl_sampler(preset, tokenizer, adapter)
    if preset.rl.rollout_int8:
        return Int8Rollouts(model, tokenizer, rollout_batch(preset.gen, model), which=preset.rl.rollout_int8)
    return HFGenerator(model, tokenizer, rollout_batch(preset.gen, model), compute=compute)


def _sft_batches(preset: Preset, run: _Run) -> list[list[dict]] | None:
    """PPO-ptx's rows for one RL step: rl.sft_rows SFT trajectories per optimizer step."""
    rl = preset.rl
    if run.sft_iter is None:
        return None
    return [[run.encoded[next(run.sft_iter).id] for _ in range(rl.sft_rows)] for _ in range(rl.mini_batches)]


def _rl_step(preset: Preset, run: _Run, step: int, pool_iter, anchor_iter, tools, sampled: list, seen: set,
             pool_ids: set, out_dir: Path, main: bool) -> tuple[dict, list, dict]:
    """One step: sample groups and score them, then the update. Returns (metrics row, the kept
    groups, the progress bar's postfix). With rl.pg_coef = 0 (the SFT-only control) nothing is
    sampled: the recipe's SFT steps on its rows."""
    t0, rl, pad_id = time.time(), preset.rl, run.tokenizer.pad_token_id
    if rl.pg_coef == 0:
        with compiled_layers(run.model, preset.model):
            row = {"step": step, "arm": "control",
                   **sft_only_update(run.model, run.optimizer, _sft_batches(preset, run), preset, pad_id, run.compute,
                                     scaler=run.scaler, scheduler=run.scheduler)}
        row["sample_seconds"] = 0.0
        return row, [[]], {"sft_loss": f"{row['sft_loss']:.3f}"}  # one update made: the adapter is saved
    groups, rewards, s = collect_batch(run.generator, pool_iter, tools, preset, anchor_iter)
    sample_seconds = round(time.time() - t0, 1)
    samples = s.pop("samples")
    sampled += [_record(r, acc, shaped, step, len(sampled) + i) for i, (r, acc, shaped) in enumerate(samples)]
    accuracy = _group_accuracy(groups, samples)
    row = {**step_metrics(step, s, samples, groups, rewards, rl, accuracy), **_revisit(samples, seen, pool_ids)}
    if groups:
        with compiled_layers(run.model, preset.model):  # fused layers for the update only: the sampler runs eager
            row.update(policy_update(run.model, run.optimizer, groups, rewards, preset, pad_id, run.compute,
                                     reference=run.reference, sft_batches=_sft_batches(preset, run), scaler=run.scaler,
                                     scheduler=run.scheduler, accuracy=accuracy))
        if run.scaler.is_enabled():  # fp16: a scale that keeps falling means overflowing steps, skipped
            row["loss_scale"] = run.scaler.get_scale()
        if hasattr(run.generator, "refresh"):  # the int8 copy: rebuilt from the new weights
            run.generator.refresh()
        if hasattr(run.generator, "set_adapter"):  # vLLM samples from the adapter on disk: push the new weights
            push_adapter(run.generator, run.model, out_dir, step, main)
        row["response_len_mean"] = sum(len(r.response_ids) for g in groups for r in g) / sum(len(g) for g in groups)
    else:
        row["skipped"] = "no group had a reward spread: nothing to learn from this batch"
    row["sample_seconds"] = sample_seconds
    return row, groups, {"acc": f"{row['accuracy']:.2f}", "kept": f"{len(groups)}/{s['sampled_groups']}"}


def _save_step(preset: Preset, run: _Run, out_dir: Path, step: int, groups, sampled, pool_iter, anchor_iter, start,
               main: bool) -> None:
    """After every step, so an interrupted run keeps its latest policy and samples; a checkpoint
    every rl.save_steps steps."""
    adapter_dir = out_dir / "adapter"
    if main:
        save_records(sampled, out_dir / "rollouts.jsonl")  # every sampled trajectory, to inspect
    if main and (groups or not (adapter_dir / "adapter_config.json").exists()):
        run.model.save_pretrained(adapter_dir)
        run.tokenizer.save_pretrained(adapter_dir)
    save_steps, steps = preset.rl.save_steps, preset.rl.steps
    if save_steps > 0 and ((step + 1) % save_steps == 0 or step + 1 == steps):
        save_checkpoint(out_dir, run.model, run.optimizer, step, pool_iter, anchor_iter, len(sampled), run.reference,
                        run.sft_iter, run.scheduler, start)


def _group_accuracy(groups: list, samples: list) -> list[list[float]]:
    """The binary task reward of every kept rollout, shaped like `rewards` (what rl.advantage="rft" reads)."""
    of = {id(r): acc for r, acc, _ in samples}
    return [[of[id(r)] for r in g] for g in groups]


def _revisit(samples: list, seen: set, pool_ids: set) -> dict:
    """`revisit_reward`: the mean task reward this step on pool questions sampled in an earlier step
    (`seen`, then updated with this step's pool questions); left out when none came back. The pool
    stream revisits questions: a gain there beside a flat `accuracy` is wording learnt, not skill."""
    again = [acc for r, acc, _ in samples if r.task.id in seen]
    seen.update(r.task.id for r, _, _ in samples if r.task.id in pool_ids)
    return {"revisit_reward": sum(again) / len(again)} if again else {}


def step_metrics(step: int, s: dict, samples: list, groups: list, rewards: list, rl, accuracy=None) -> dict:
    """One RL step's row of metrics.jsonl, from collect_batch's counts `s` and its sampled rollouts."""
    return {
        "step": step,
        # the binary task reward (anchors included) and the shaped one the advantages are computed
        # from (+ DAPO's overlong punishment); metrics written before both were logged have one
        # "reward_mean", the shaped one
        "reward_task_mean": s["task_reward_sum"] / max(1, s["sampled_rollouts"]),
        "reward_shaped_mean": s["shaped_reward_sum"] / max(1, s["sampled_rollouts"]),
        # the pool's questions only (anchors are reported on their own below)
        "accuracy": (s["solved"] - s["anchor_solved"])
        / max(1, s["sampled_rollouts"] - s["anchor_groups"] * rl.group_size),
        "kept_groups": len(groups),
        "sampled_groups": s["sampled_groups"],
        "sampling_rounds": s["rounds"],
        "tool_calls_per_rollout": s["tool_calls"] / max(1, s["sampled_rollouts"]),
        "anchor_groups": s["anchor_groups"],
        "anchor_groups_kept": s["anchor_groups_kept"],
        # the anchors' sampled accuracy: a drop is drift away from what SFT did well
        "anchor_accuracy": s["anchor_solved"] / max(1, s["anchor_groups"] * rl.group_size),
        # every sampled rollout's length (policy + observation tokens): what the response
        # budget (gen.max_response_tokens) cuts
        "response_len_sampled": sum(len(r.response_ids) for r, _, _ in samples) / max(1, len(samples)),
        # the policy's own tokens of the same rollouts: what the overlong punishment counts
        "response_len_policy": sum(r.policy_tokens for r, _, _ in samples) / max(1, len(samples)),
        # mean entropy (nats) of the distributions the sampled policy tokens were drawn from:
        # a collapse towards one answer shows as a falling entropy, a loop as a very low one
        "entropy": _mean([e for r, _, _ in samples for e in r.entropies]),
        # rollouts cut by the per-turn cap (gen.max_new_tokens): loops, kept in the loss
        "turn_cut_rollouts": sum(r.finish == "turn_length" for r, _, _ in samples),
        "overlong_rollouts": sum(r.truncated for r, _, _ in samples),
        # rollouts whose advantage is not zero: the only ones that move the weights. The
        # rest of the sampled ones were dropped or sat in an all-equal group (wasted work).
        "signal_rollouts": int((dapo.advantages(torch.tensor(rewards), rl.advantage,
                                                torch.tensor(accuracy) if accuracy is not None else None) != 0).sum())
        if groups else 0,
    }


def push_adapter(generator, model, out_dir: Path, step: int, main: bool) -> None:
    """Hand a sampler that reads adapters from disk (vLLM) the weights of this step."""
    step_dir = out_dir / "sampler" / f"step{step}"
    if main:
        model.save_pretrained(step_dir)
    distributed.barrier()  # written before any rank's sampler reads it
    generator.set_adapter(step_dir)
    distributed.barrier()  # loaded everywhere: the older step folders can go
    if main:  # keep this one and the one before (a 32B rank-64 adapter is ~1 GB)
        for old in (out_dir / "sampler").glob("step*"):
            if old.name not in (step_dir.name, f"step{step - 1}"):
                shutil.rmtree(old, ignore_errors=True)
