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

from coa_lab import distributed
from coa_lab.student_rollout import Rollout
from coa_lab.config import Preset
from coa_lab.rl import dapo, optim
from coa_lab.rl.checkpoint import CountedStream, TaskCycle, latest_rl_checkpoint, restore_run, save_checkpoint
from coa_lab.rl.pool import anchor_stream
from coa_lab.rl.rollouts import collect_batch
from coa_lab.rl.update import policy_update, sft_only_update
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
    import torch
    from coa_lab.progress import progress_bar

    from coa_lab.generation.backends import resolve_backend, rollout_batch
    from coa_lab.generation.hf_generator import HFGenerator
    from coa_lab.generation.models import compute_context, grad_scaler, load_model

    check_settings(preset, sft_records)  # before anything is loaded: a refused run costs nothing
    distributed.init()  # under `accelerate launch`: join the ranks (a no-op in one process)
    distributed.require_replicated_policy("RL")
    main = distributed.is_main()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rl = preset.rl
    seed = rl_seed(preset)
    random.seed(seed)  # the same on every rank: they draw the same tasks, in the same order
    torch.manual_seed(seed)  # the same LoRA initialisation on every rank ...
    checkpoint = latest_rl_checkpoint(out_dir) if resume else None
    state = torch.load(checkpoint / "state.pt", weights_only=False) if checkpoint else None
    model, tokenizer = load_model(preset.model, adapter=checkpoint / "adapter" if checkpoint else adapter, trainable=True)
    if distributed.world_size() > 1:  # ... but each rank samples its own rollouts
        torch.manual_seed(seed + 1000 * distributed.rank())
    compute = lambda: compute_context(model, preset.model)  # noqa: E731 - same numerics for sampling and training
    scaler = grad_scaler(model, preset.model)  # fp16 on a card without bf16; elsewhere a pass-through
    if generator_factory is not None:
        generator = generator_factory(model, tokenizer)
    elif resolve_backend(preset.gen.backend) in ("vllm", "vllm-server"):  # samples the adapter on disk, pushed after each update
        from coa_lab.generation.llm import rl_sampler

        generator = rl_sampler(preset, tokenizer, checkpoint / "adapter" if checkpoint else adapter)
    elif rl.rollout_int8:  # an int8 copy samples, rebuilt after every update; TIS corrects the loss
        from coa_lab.rl.int8_rollouts import Int8Rollouts

        generator = Int8Rollouts(model, tokenizer, rollout_batch(preset.gen, model), which=rl.rollout_int8)
    else:  # the policy itself samples: always the current weights
        generator = HFGenerator(model, tokenizer, rollout_batch(preset.gen, model), compute=compute)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer, scheduler = optim.build_optimizer(params, rl)  # AdamW; a constant rate unless rl.lr_schedule says
    reference = None
    if rl.kl_coef > 0:  # the SFT adapter's weights: this run's start, or the checkpoint's copy of them
        from coa_lab.rl.reference import ReferenceWeights

        if state is not None and state.get("reference") is None:
            raise ValueError("rl.kl_coef > 0, but the checkpoint was written without a KL reference; "
                             "resume with the settings the run started with (rl.kl_coef=0)")
        reference = ReferenceWeights(model, state["reference"] if state is not None else None)
    pool = list(train_tasks)
    if not pool:
        raise ValueError("RL needs training tasks; the pool is empty")
    sft_iter = None
    if rl.sft_coef > 0:
        from coa_lab.training.sft import encode_example, record_messages

        encoded = {rec.id: encode_example(tokenizer, record_messages(rec), rec.text, preset.sft.max_length,
                                          mask_observations=preset.sft.mask_observations) for rec in sft_records}
        # its own RNG: the control arm, which samples nothing, draws the rows the recipe draws
        sft_iter = TaskCycle(list(sft_records), rng=random.Random(seed))

    def draw_sft_batches() -> list[list[dict]]:
        """PPO-ptx's rows for one RL step: rl.sft_rows SFT trajectories per optimizer step."""
        return [[encoded[next(sft_iter).id] for _ in range(rl.sft_rows)] for _ in range(rl.mini_batches)]

    pool_iter = TaskCycle(pool)
    anchor_iter = CountedStream(anchor_stream(list(anchors), seed)) if anchors and rl.anchors_per_step > 0 else None
    metrics_path = out_dir / "metrics.jsonl"
    adapter_dir = out_dir / "adapter"
    metrics, sampled, first_step = [], [], 0
    if state is not None:  # continue exactly where the checkpoint left off
        metrics, sampled, first_step = restore_run(state, out_dir, optimizer, pool_iter, anchor_iter, sft_iter)
        optim.restore_schedule(scheduler, state, rl)
    # delta_norm's origin: the run's first weights (the KL reference's copy when there is one)
    start = optim.StartWeights(model, (state.get("start") or state.get("reference")) if state is not None else None)
    pool_ids = {t.id for t in pool}
    seen = {r.task_id for r in sampled} & pool_ids  # pool questions sampled in earlier steps
    # rank 0 writes the run folder; the other ranks compute the same rows and keep them in memory
    with open(metrics_path if main else os.devnull, "w") as log, \
            progress_bar(total=rl.steps, initial=first_step, desc="rl", unit="step", disable=not main) as bar:
        for row in metrics:
            log.write(json.dumps(row) + "\n")
        for step in range(first_step, rl.steps):
            t0 = time.time()
            if rl.pg_coef == 0:  # the SFT-only control: no rollouts, the recipe's SFT steps on its rows
                row = {"step": step, "arm": "control",
                       **sft_only_update(model, optimizer, draw_sft_batches(), preset, tokenizer.pad_token_id,
                                         compute, scaler=scaler, scheduler=scheduler)}
                groups, sample_seconds = [[]], 0.0  # one update made: the adapter is saved below
                postfix = {"sft_loss": f"{row['sft_loss']:.3f}"}
            else:
                groups, rewards, s = collect_batch(generator, pool_iter, tools, preset, anchor_iter)
                sample_seconds = round(time.time() - t0, 1)
                samples = s.pop("samples")
                sampled += [_record(r, acc, shaped, step, len(sampled) + i) for i, (r, acc, shaped) in enumerate(samples)]
                accuracy = _group_accuracy(groups, samples)
                row = {**step_metrics(step, s, samples, groups, rewards, rl, accuracy), **_revisit(samples, seen, pool_ids)}
                if groups:
                    # PPO-ptx: one draw of rl.sft_rows SFT trajectories per optimizer step
                    sft_batches = draw_sft_batches() if sft_iter is not None else None
                    row.update(policy_update(model, optimizer, groups, rewards, preset, tokenizer.pad_token_id, compute,
                                             reference=reference, sft_batches=sft_batches, scaler=scaler,
                                             scheduler=scheduler, accuracy=accuracy))
                    if scaler.is_enabled():  # fp16: a scale that keeps falling means overflowing steps, skipped
                        row["loss_scale"] = scaler.get_scale()
                    if hasattr(generator, "refresh"):  # the int8 copy: rebuilt from the new weights
                        generator.refresh()
                    if hasattr(generator, "set_adapter"):  # vLLM samples from the adapter on disk: push the new weights
                        push_adapter(generator, model, out_dir, step, main)
                    row["response_len_mean"] = sum(len(r.response_ids) for g in groups for r in g) / sum(len(g) for g in groups)
                else:
                    row["skipped"] = "no group had a reward spread: nothing to learn from this batch"
                postfix = {"acc": f"{row['accuracy']:.2f}", "kept": f"{len(groups)}/{s['sampled_groups']}"}
            row.update(delta_norm=start.delta_norm(), **optim.lr_scales(scheduler))  # drift vs noise: docs/design.md
            row["seconds"] = round(time.time() - t0, 1)
            row["sample_seconds"] = sample_seconds  # the rest of `seconds` is the update (and saving)
            metrics.append(row)
            bar.update(1)
            bar.set_postfix(**postfix)
            log.write(json.dumps(row) + "\n")
            log.flush()
            if on_step is not None:
                on_step(step, row, model)
            # After every step, so an interrupted run keeps its latest policy and samples.
            if main:
                save_records(sampled, out_dir / "rollouts.jsonl")  # every sampled trajectory, to inspect
            if main and (groups or not (adapter_dir / "adapter_config.json").exists()):
                model.save_pretrained(adapter_dir)
                tokenizer.save_pretrained(adapter_dir)
            if rl.save_steps > 0 and ((step + 1) % rl.save_steps == 0 or step + 1 == rl.steps):
                save_checkpoint(out_dir, model, optimizer, step, pool_iter, anchor_iter, len(sampled), reference,
                                sft_iter, scheduler, start)
    distributed.barrier()  # rank 0's files are complete before any rank returns
    return RLResult(adapter_dir, metrics)


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
    import torch

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
