"""Stage 4, DAPO RL: multi-turn rollouts that execute real tools, a binary verifiable reward,
observation tokens masked out of the loss.

One step:
1. draw prompts; roll out `group_size` trajectories each (coa_runner.run_coa: tools run);
2. reward = the task's scorer on the final answer (the same function evaluation uses),
   plus DAPO's soft overlong punishment;
3. dynamic sampling: drop groups with all-equal rewards, draw fresh prompts to refill
   (up to `max_sampling_rounds` extra draws);
4. GRPO advantages within each group;
5. old log-probs (for the mini-batches after the first), then `mini_batches` optimizer
   steps with the clip-higher, token-level loss. Mask = policy tokens only (prompt,
   observations, padding and, with overlong filtering, truncated samples get 0). A
   mini-batch is whole groups, and each forward packs one group's samples in one row
   (coa_lab/packing.py): their shared prompt is computed once, no padding at all.

Simplifications, on purpose: no KL term and no critic (as DAPO); one pass over each batch;
sampling and training share one process (on GPU the vLLM generator swaps in the adapter).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from coa_lab import protocol
from coa_lab import distributed
from coa_lab.agents.coa_runner import Rollout, run_coa_across_ranks
from coa_lab.config import Preset
from coa_lab.rl import dapo
from coa_lab.rl.pool import anchor_stream
from coa_lab.tasks.scorers import reward as task_reward
from coa_lab.trajectories import TrajectoryRecord, save_records


@dataclass
class RLResult:
    adapter_dir: Path
    metrics: list[dict] = field(default_factory=list)


def score_rollouts(rollouts: list[Rollout], max_len: int, buffer: int) -> tuple[list[float], list[float]]:
    """(task rewards, shaped rewards): the binary verifiable reward from the task's scorer, and
    that reward plus DAPO's soft overlong punishment (what the advantages are computed from)."""
    import torch

    base = [task_reward(r.task, protocol.final_answer(r.text)) for r in rollouts]
    lengths = torch.tensor([len(r.response_ids) for r in rollouts])
    shaping = dapo.overlong_penalty(lengths, max_len, buffer).tolist() if buffer > 0 else [0.0] * len(rollouts)
    return base, [b + s for b, s in zip(base, shaping)]


def collect_batch(generator, pool_iter, tools, preset: Preset,
                  anchor_iter=None) -> tuple[list[list[Rollout]], list[list[float]], dict]:
    """Sample groups until `prompts_per_step` informative groups are collected (or rounds run out).

    Dynamic sampling looks at ACCURACY, as DAPO does: a group whose answers are all right or
    all wrong teaches nothing about correctness, even if length shaping makes rewards differ.
    The first round also samples `anchors_per_step` anchor questions (ones the SFT policy
    always solved): an anchor group only enters the batch if the policy has started to fail it.
    """
    import torch

    rl, gen = preset.rl, preset.gen
    groups, rewards, stats = [], [], {"sampled_groups": 0, "sampled_rollouts": 0, "raw_reward_sum": 0.0,
                                      "solved": 0, "tool_calls": 0, "rounds": 0, "samples": [],
                                      "anchor_groups": 0, "anchor_groups_kept": 0, "anchor_solved": 0}
    for round_ in range(rl.max_sampling_rounds + 1):
        need = rl.prompts_per_step - len(groups)
        if need <= 0:
            break
        tasks = [next(pool_iter) for _ in range(need)]
        n_anchors = rl.anchors_per_step if (round_ == 0 and anchor_iter is not None) else 0
        tasks += [next(anchor_iter) for _ in range(n_anchors)]
        need = len(tasks)
        # in a launched run each rank rolls out its share and all get the whole batch back
        rollouts = run_coa_across_ranks(generator, tasks, tools, gen, samples=rl.group_size,
                                        temperature=rl.temperature, progress="sample")
        accuracy, scores = score_rollouts(rollouts, gen.max_response_tokens, rl.overlong_buffer)
        stats["rounds"] = round_ + 1
        stats["sampled_groups"] += need
        stats["sampled_rollouts"] += len(rollouts)
        stats["raw_reward_sum"] += sum(scores)
        stats["solved"] += sum(a == 1.0 for a in accuracy)
        stats["tool_calls"] += sum(r.tool_calls for r in rollouts)
        stats["samples"] += list(zip(rollouts, accuracy, scores))
        for g in range(need):
            window = slice(g * rl.group_size, (g + 1) * rl.group_size)
            keep = not rl.dynamic_sampling or bool(dapo.informative_groups(torch.tensor([accuracy[window]]))[0])
            if g >= need - n_anchors:
                stats["anchor_groups"] += 1
                stats["anchor_groups_kept"] += keep
                stats["anchor_solved"] += sum(a == 1.0 for a in accuracy[window])
            if keep:
                groups.append(rollouts[window])
                rewards.append(scores[window])
        if not rl.dynamic_sampling:
            break
    return groups, rewards, stats


def _record(r: Rollout, accuracy: float, shaped: float, step: int, n: int) -> TrajectoryRecord:
    return TrajectoryRecord(
        id=f"rl-{step}-{n}", task_id=r.task.id, source="rl", profile=r.task.profile,
        question=r.task.question, answers=list(r.task.answers), text=r.text, reward=accuracy,
        n_tokens=len(r.response_ids), n_tool_calls=r.tool_calls,
        metadata={"step": step, "shaped_reward": shaped, "finish": r.finish, "truncated": r.truncated},
    )


def _pad(rows: list[list[int]], value: int):
    import torch

    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows])


def rl_seed(preset: Preset) -> int:
    """The seed of RL's randomness: `rl.seed`, or the preset's when unset."""
    return preset.seed if preset.rl.seed is None else preset.rl.seed


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


MICRO_BATCH = 4  # rollouts per forward: bounds the logits of a step ([rollouts x response, V])


def _micro_batches(groups, mini_batches: int) -> list[list[list[int]]]:
    """Rollout indices as mini-batches (one optimizer step each) of micro-batches (one
    forward each). Mini-batches are whole groups in shuffled order, and a micro-batch holds
    up to MICRO_BATCH rollouts of ONE group: they share their prompt, which the packed
    forward then computes once."""
    starts, n = [], 0
    for g in groups:
        starts.append(n)
        n += len(g)
    order = list(range(len(groups)))
    random.shuffle(order)
    size = -(-len(order) // max(1, min(mini_batches, len(order))))  # ceil: at most `mini_batches` steps
    out = []
    for i in range(0, len(order), size):
        micro = []
        for g in order[i : i + size]:
            idx = list(range(starts[g], starts[g] + len(groups[g])))
            micro += [idx[j : j + MICRO_BATCH] for j in range(0, len(idx), MICRO_BATCH)]
        out.append(micro)
    return out


def policy_update(model, optimizer, groups, rewards, preset: Preset, pad_id: int, compute=None,
                  packed: bool | None = None, reference=None) -> dict:
    """Old log-probs, advantages, then mini-batch steps on the DAPO loss.

    compute: a context-manager factory for forward passes (bf16 autocast on CPU).
    reference: rl/reference.ReferenceWeights, the SFT policy of the KL term (rl.kl_coef > 0).
    packed: one packed row per micro-batch (default: wherever the model's attention allows
    it) or padded rows (benchmarks/bench_rl_update.py compares them)."""
    import contextlib

    import torch

    from coa_lab import packing

    compute = compute or contextlib.nullcontext
    rl = preset.rl
    device = next(model.parameters()).device
    adv = dapo.group_advantages(torch.tensor(rewards, dtype=torch.float32)).flatten().to(device)  # [N]
    flat = [r for g in groups for r in g]
    ids = [r.prompt_ids + r.response_ids for r in flat]
    masks = [[0] * len(r.prompt_ids) + (r.response_mask if not (rl.overlong_filter and r.truncated)
                                        else [0] * len(r.response_ids)) for r in flat]
    input_ids, loss_mask = _pad(ids, pad_id).to(device), _pad(masks, 0).to(device)
    attention = _pad([[1] * len(x) for x in ids], 0).to(device)
    width = input_ids.shape[1]
    packed = packing.supported(model) if packed is None else packed

    def logprobs(sub: list[int]):
        """[len(sub), width] log-probs of rollouts `sub` (one group's: they share a prompt)."""
        if packed:  # the shared prompt once, no padding (coa_lab/packing.py)
            return packing.sequence_logprobs(model, [ids[i] for i in sub], [list(range(len(sub)))],
                                             [len(flat[i].prompt_ids) for i in sub], pad_id, width,
                                             temperature=rl.temperature)
        # padded to the micro-batch's longest; no prompt token is in the loss: skip their logits
        t, longest = torch.tensor(sub, device=device), max(len(ids[i]) for i in sub)
        out = dapo.token_logprobs(model, input_ids[t, :longest], attention[t, :longest],
                                  min(len(flat[i].prompt_ids) for i in sub), temperature=rl.temperature)
        return torch.nn.functional.pad(out, (0, width - longest))

    # Truncated importance sampling (rl.rollout_int8): each policy token's loss weighed by
    # min(pi_train / pi_rollout, tis_cap), pi_train being the pre-update policy (`old` below)
    # and pi_rollout the probability the int8 sampler drew the token with
    tis = rl.rollout_int8 and rl.tis_cap is not None
    if tis:
        has_lp = torch.tensor([len(r.response_logprobs) == len(r.response_ids) for r in flat], device=device)
        sampler_lp = _pad([[0.0] * len(r.prompt_ids) + (r.response_logprobs if ok else [0.0] * len(r.response_ids))
                           for r, ok in zip(flat, has_lp.tolist())], 0.0).to(device)
        log_cap = math.log(rl.tis_cap)
    mini_batches = _micro_batches(groups, rl.mini_batches)  # the same on every rank: one shared `random`
    # Data parallel (coa_lab/distributed.py): every rank holds the whole batch; rank r computes
    # micro-batches r, r + world, ... of each mini-batch, and the gradients are summed before the
    # step. One process computes them all: the same sum, in another order.
    world, me = distributed.world_size(), distributed.rank()
    mine = [[sub for k, sub in enumerate(mb) if k % world == me] for mb in mini_batches]
    # Old log-probs: the first mini-batch is trained before any update, so its own forward IS the
    # sampling policy's (its ratio is exactly 1, detached below); only the later mini-batches
    # need a no-grad pass now, before the weights move. Saves one forward over 1/mini_batches
    # of the batch (the whole old-log-prob pass at mini_batches=1).
    old = torch.zeros(input_ids.shape, dtype=torch.float32, device=device)
    model.eval()  # no dropout: old and new log-probs must come from the same function
    with torch.no_grad(), compute():
        for sub in (sub for mb in mine[1:] for sub in mb):
            old[torch.tensor(sub, device=device)] = logprobs(sub).float()
    ref = None
    if reference is not None and rl.kl_coef > 0:  # the SFT policy's log-probs: one more no-grad pass
        ref = torch.zeros(input_ids.shape, dtype=torch.float32, device=device)
        with torch.no_grad(), compute(), reference.active():
            for sub in (sub for mb in mine for sub in mb):
                ref[torch.tensor(sub, device=device)] = logprobs(sub).float()
    model.train()  # gradient checkpointing (GPU presets) is only active in train mode
    stats: dict[str, list[float]] = {"loss": [], "clip_frac": [], "ratio_mean": [], "approx_kl": [], "high_ratio_frac": []}
    params = [p for p in model.parameters() if p.requires_grad]
    for n_mb, mb in enumerate(mini_batches):
        n_tokens = float(loss_mask[torch.tensor([i for sub in mb for i in sub], device=device)].sum().clamp(min=1))
        n_sequences = float(sum(len(sub) for sub in mb))
        optimizer.zero_grad()
        for sub in mine[n_mb]:
            t = torch.tensor(sub, device=device)
            with compute():
                logp = logprobs(sub)
            if n_mb == 0:  # before any update: this forward is the old policy; kept for the gap below
                old[t] = logp.detach().float()
            old_sub = old[t]
            weights = None
            if tis:
                log_w = torch.where(has_lp[t][:, None], old_sub - sampler_lp[t], torch.zeros_like(old_sub))
                weights = torch.exp(log_w.clamp(max=log_cap))
                on = loss_mask[t].float()
                n_on = on.sum().clamp(min=1)
                stats.setdefault("tis_capped_frac", []).append(float(((log_w > log_cap).float() * on).sum() / n_on))
                stats.setdefault("tis_weight_mean", []).append(float((weights * on).sum() / n_on))
            loss, st = dapo.dapo_token_loss(logp, old_sub, adv[t], loss_mask[t],
                                            rl.clip_low, rl.clip_high, n_tokens=n_tokens,
                                            aggregation=rl.loss_agg, n_sequences=n_sequences,
                                            token_weights=weights,
                                            ref_logprobs=ref[t] if ref is not None else None, kl_coef=rl.kl_coef)
            loss.backward()
            stats["loss"].append(float(loss.detach()))
            if "kl_ref" in st:
                stats.setdefault("kl_ref", []).append(st["kl_ref"])
            for k in ("clip_frac", "ratio_mean", "approx_kl", "high_ratio_frac"):
                stats[k].append(st[k])
        distributed.all_reduce_gradients(params)  # the whole mini-batch's gradient on every rank
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
    # Consistency: `old` now holds the trainer's pre-update log-prob of every token this rank
    # scored. On policy tokens it must equal the log-prob the sampler drew the token with (same
    # weights, same temperature): verl's rollout_probs_diff_mean, over every policy token, the
    # overlong-filtered samples included.
    gap_sum, gap_n, gap_max = 0.0, 0.0, 0.0
    scored = sorted({i for mb in mine for sub in mb for i in sub})
    with_lp = [i for i in scored if len(flat[i].response_logprobs) == len(flat[i].response_ids)]
    if with_lp:
        t = torch.tensor(with_lp, device=device)
        sampler = _pad([[0.0] * len(flat[i].prompt_ids) + flat[i].response_logprobs for i in with_lp], 0.0)
        policy = _pad([[0] * len(flat[i].prompt_ids) + flat[i].response_mask for i in with_lp], 0)
        width_lp = sampler.shape[1]
        gap = dapo.probability_gap(old[t, :width_lp], sampler.to(device), policy.to(device))
        gap_sum, gap_n, gap_max = float(gap.sum()), float(gap.numel()), float(gap.max()) if gap.numel() else 0.0
    # per-micro-batch statistics: sums and counts over all ranks, so the log is one process's
    keys = list(stats)
    totals = distributed.all_reduce_sum([sum(stats[k]) for k in keys] + [gap_sum, gap_n]
                                        + [float(len(stats["clip_frac"]))])
    count = totals[-1]
    out = {k: (totals[i] / count if count else 0.0) for i, k in enumerate(keys)}
    if totals[-2] > 0:  # a backend that reports no sampling log-probs (vLLM here) leaves it out
        out["logprob_gap"] = totals[-3] / totals[-2]  # mean |p_trainer - p_sampler| per policy token
        out["logprob_gap_max"] = gap_max  # this rank's largest
    out["loss"] = totals[keys.index("loss")] / max(1, len(mini_batches))
    out["train_tokens"] = int(loss_mask.sum())
    out["masked_observation_tokens"] = sum(len(r.response_mask) - sum(r.response_mask) for r in flat)
    return out


class _Counted:
    """An endless task iterator that counts what it handed out: a checkpoint stores the count,
    and a resumed run replays the stream up to it (the anchor stream has its own seeded RNG)."""

    def __init__(self, it):
        self.it, self.n = it, 0

    def __iter__(self):
        return self

    def __next__(self):
        self.n += 1
        return next(self.it)

    def skip(self, n: int) -> None:
        for _ in range(n):
            next(self)


class _TaskCycle:
    """Every pool task once per pass, each pass reshuffled with the global `random` (seeded by
    train_rl). Its order and position go into a checkpoint, so a resumed run draws on exactly."""

    def __init__(self, items: list):
        self.items, self.pos = list(items), len(items)  # the first draw shuffles

    def __iter__(self):
        return self

    def __next__(self):
        if self.pos >= len(self.items):
            random.shuffle(self.items)
            self.pos = 0
        self.pos += 1
        return self.items[self.pos - 1]

    def state(self) -> dict:
        return {"order": [t.id for t in self.items], "pos": self.pos}

    def restore(self, state: dict) -> None:
        by_id = {t.id: t for t in self.items}
        if set(by_id) != set(state["order"]):
            raise ValueError("the checkpoint was trained on another pool: resume with the same tasks")
        self.items, self.pos = [by_id[i] for i in state["order"]], state["pos"]


CHECKPOINT = "checkpoint"


def _save_checkpoint(out_dir: Path, model, optimizer, step: int, pool_iter: _TaskCycle, anchor_iter, n_sampled: int,
                     reference=None) -> None:
    """out_dir/checkpoint: the adapter, the optimizer, the next step, every RNG and how far each
    task stream got. Written beside the old one and swapped in, so a kill mid-save leaves one."""

    import torch

    # every rank samples with its own torch generator: all of them go into the one checkpoint
    torch_rngs = distributed.gather_rows([torch.get_rng_state()])
    cuda_rngs = distributed.gather_rows([torch.cuda.get_rng_state() if torch.cuda.is_available() else None])
    if not distributed.is_main():  # the replicas are identical: rank 0 writes for all
        return
    tmp, final, old = out_dir / f"{CHECKPOINT}.tmp", out_dir / CHECKPOINT, out_dir / f"{CHECKPOINT}.old"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp / "adapter")
    torch.save({"next_step": step + 1, "optimizer": optimizer.state_dict(), "python_random": random.getstate(),
                "torch_rng": torch_rngs[0], "torch_rng_by_rank": torch_rngs, "cuda_rng_by_rank": cuda_rngs,
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                "pool": pool_iter.state(), "anchors_drawn": anchor_iter.n if anchor_iter is not None else 0,
                "sampled_records": n_sampled,
                "reference": reference.state() if reference is not None else None}, tmp / "state.pt")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


def latest_rl_checkpoint(out_dir: str | Path) -> Path | None:
    """The RL checkpoint of a run folder (or the previous one, if a kill hit the swap)."""
    for name in (CHECKPOINT, f"{CHECKPOINT}.old"):
        path = Path(out_dir) / name
        if (path / "state.pt").exists() and (path / "adapter" / "adapter_config.json").exists():
            return path
    return None


def train_rl(preset: Preset, train_tasks: list, tools, out_dir: str | Path, adapter: str | Path | None = None,
             generator_factory=None, anchors: list | None = None, resume: bool = False, on_step=None) -> RLResult:
    """Run `preset.rl.steps` DAPO steps from `adapter` (the SFT output) on `train_tasks`;
    `anchors` (questions the SFT policy always solved) are sampled beside them, see collect_batch.

    Every `rl.save_steps` steps out_dir/checkpoint holds the adapter, the optimizer state, the
    step, the RNG states and how far the task streams got; resume=True continues from it (the
    metrics and sampled rollouts before it are kept) and is a fresh start when there is none.
    on_step(step, row, model): called on every rank after each step (a live plot, a test's probe).

    Under `accelerate launch` (configs/ddp.yaml) every rank runs this function: they draw the
    same tasks, each rolls out its share, and the update's gradient is summed over the ranks
    (coa_lab/distributed.py); rank 0 writes the files."""
    import torch
    from coa_lab.progress import progress_bar

    from coa_lab.llm import HFGenerator
    from coa_lab.models import compute_context, load_model
    from coa_lab.trajectories import load_records

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
    if generator_factory is not None:
        generator = generator_factory(model, tokenizer)
    elif preset.gen.backend in ("vllm", "vllm-server"):  # samples from the adapter on disk, pushed after each update
        from coa_lab.llm import rl_sampler

        generator = rl_sampler(preset, tokenizer, checkpoint / "adapter" if checkpoint else adapter)
    elif rl.rollout_int8:  # an int8 copy samples, rebuilt after every update; TIS corrects the loss
        from coa_lab.rl.int8_rollouts import Int8Rollouts

        generator = Int8Rollouts(model, tokenizer, preset.gen.batch_size)
    else:  # the policy itself samples: always the current weights
        generator = HFGenerator(model, tokenizer, preset.gen.batch_size, compute=compute)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=rl.learning_rate, weight_decay=0.0)
    reference = None
    if rl.kl_coef < 0:
        raise ValueError(f"rl.kl_coef must be >= 0 (0 turns the KL term off), got {rl.kl_coef}")
    if rl.kl_coef > 0:  # the SFT adapter's weights: this run's start, or the checkpoint's copy of them
        from coa_lab.rl.reference import ReferenceWeights

        if state is not None and state.get("reference") is None:
            raise ValueError("rl.kl_coef > 0, but the checkpoint was written without a KL reference; "
                             "resume with the settings the run started with (rl.kl_coef=0)")
        reference = ReferenceWeights(model, state["reference"] if state is not None else None)
    pool = list(train_tasks)
    if not pool:
        raise ValueError("RL needs training tasks; the pool is empty")

    pool_iter = _TaskCycle(pool)
    anchor_iter = _Counted(anchor_stream(list(anchors), seed)) if anchors and rl.anchors_per_step > 0 else None
    metrics_path = out_dir / "metrics.jsonl"
    adapter_dir = out_dir / "adapter"
    metrics, sampled, first_step = [], [], 0
    if state is not None:  # continue exactly where the checkpoint left off
        optimizer.load_state_dict(state["optimizer"])
        pool_iter.restore(state["pool"])
        if anchor_iter is not None:
            anchor_iter.skip(state["anchors_drawn"])
        random.setstate(state["python_random"])
        me = distributed.rank()
        by_rank = state.get("torch_rng_by_rank") or [state["torch_rng"]]
        if len(by_rank) != distributed.world_size():
            raise ValueError(f"the checkpoint was written by {len(by_rank)} rank(s); resume it with the same number "
                             f"of processes (this run has {distributed.world_size()})")
        torch.set_rng_state(by_rank[me])
        if torch.cuda.is_available() and (state.get("cuda_rng_by_rank") or [None])[me] is not None:
            torch.cuda.set_rng_state(state["cuda_rng_by_rank"][me])
        elif state["cuda_rng"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        first_step = state["next_step"]
        metrics = [json.loads(line) for line in metrics_path.read_text().splitlines()][:first_step]
        sampled = load_records(out_dir / "rollouts.jsonl")[: state["sampled_records"]]
    # rank 0 writes the run folder; the other ranks compute the same rows and keep them in memory
    with open(metrics_path if main else os.devnull, "w") as log, \
            progress_bar(total=rl.steps, initial=first_step, desc="rl", unit="step", disable=not main) as bar:
        for row in metrics:
            log.write(json.dumps(row) + "\n")
        for step in range(first_step, rl.steps):
            t0 = time.time()
            groups, rewards, s = collect_batch(generator, pool_iter, tools, preset, anchor_iter)
            sample_seconds = round(time.time() - t0, 1)
            samples = s.pop("samples")
            sampled += [_record(r, acc, shaped, step, len(sampled) + i) for i, (r, acc, shaped) in enumerate(samples)]
            row = {
                "step": step,
                "reward_mean": s["raw_reward_sum"] / max(1, s["sampled_rollouts"]),
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
                # every sampled rollout's length (policy + observation tokens): the curve DAPO's
                # overlong shaping acts on
                "response_len_sampled": sum(len(r.response_ids) for r, _, _ in samples) / max(1, len(samples)),
                # mean entropy (nats) of the distributions the sampled policy tokens were drawn from:
                # a collapse towards one answer shows as a falling entropy, a loop as a very low one
                "entropy": _mean([e for r, _, _ in samples for e in r.entropies]),
                # rollouts cut by the per-turn cap (gen.max_new_tokens): loops, kept in the loss
                "turn_cut_rollouts": sum(r.finish == "turn_length" for r, _, _ in samples),
                "overlong_rollouts": sum(r.truncated for r, _, _ in samples),
                # rollouts whose advantage is not zero: the only ones that move the weights. The
                # rest of the sampled ones were dropped or sat in an all-equal group (wasted work).
                "signal_rollouts": int((dapo.group_advantages(torch.tensor(rewards)) != 0).sum()) if groups else 0,
            }
            if groups:
                row.update(policy_update(model, optimizer, groups, rewards, preset, tokenizer.pad_token_id, compute,
                                         reference=reference))
                if hasattr(generator, "refresh"):  # the int8 copy: rebuilt from the new weights
                    generator.refresh()
                if hasattr(generator, "set_adapter"):  # vLLM samples from the adapter on disk: push the new weights
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
                row["response_len_mean"] = sum(len(r.response_ids) for g in groups for r in g) / sum(len(g) for g in groups)
            else:
                row["skipped"] = "no group had a reward spread: nothing to learn from this batch"
            row["seconds"] = round(time.time() - t0, 1)
            row["sample_seconds"] = sample_seconds  # the rest of `seconds` is the update (and saving)
            metrics.append(row)
            bar.update(1)
            bar.set_postfix(acc=f"{row['accuracy']:.2f}", kept=f"{len(groups)}/{s['sampled_groups']}")
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
                _save_checkpoint(out_dir, model, optimizer, step, pool_iter, anchor_iter, len(sampled), reference)
    distributed.barrier()  # rank 0's files are complete before any rank returns
    return RLResult(adapter_dir, metrics)
