"""RL's update half (steps 4-5 of rl/trainer.py): `policy_update` is one DAPO update, the
algorithm in one screen; the functions below it are its named parts (truncated importance
sampling, the KL reference pass, the SFT mix, the statistics), and rl/update_batch.py holds the
rollouts as tensors and how they are cut into optimizer steps and forwards. The loss itself is
rl/dapo.py's. Under `accelerate launch` each rank computes its share of the micro-batches and the
gradients are summed (coa_lab/distributed.py)."""

from __future__ import annotations

import contextlib

import torch

from coa_lab import distributed
from coa_lab.config import Preset
from coa_lab.rl import dapo, optim
from coa_lab.rl.update_batch import MICRO_BATCH, RolloutBatch, micro_batches, rank_share  # noqa: F401 - MICRO_BATCH: the planner's
from coa_lab.training import packing
from coa_lab.training.sft import IGNORE_INDEX, masked_lm_loss, pack_batch, pad_batch


def policy_update(model, optimizer, groups, rewards, preset: Preset, pad_id: int, compute=None,
                  packed: bool | None = None, reference=None, sft_batches: list[list[dict]] | None = None,
                  scaler=None, scheduler=None, accuracy: list[list[float]] | None = None) -> dict:
    """One DAPO update: advantages -> old log-probs -> per mini-batch, the clipped token-level loss
    of every micro-batch, backward, one optimizer step. Returns the step's statistics.

    groups, rewards: the kept groups of rollouts and their shaped rewards ([n_groups][G]).
    compute: a context-manager factory for forward passes (bf16 autocast on CPU).
    reference: rl/reference.ReferenceWeights, the SFT policy of the KL term (rl.kl_coef > 0).
    sft_batches: with rl.sft_coef > 0, one list of encoded SFT rows (sft.encode_example) per
    mini-batch: rl.sft_coef x their masked SFT loss joins that optimizer step (PPO-ptx).
    packed: one packed row per micro-batch (default: wherever the model's attention allows
    it) or padded rows (benchmarks/bench_rl_update.py compares them).
    scheduler: the learning-rate schedule, stepped after every optimizer step (rl/optim.py).
    accuracy: the binary task reward of each rollout, like `rewards`: what rl.advantage = "rft"
    calls correct (default: `rewards`)."""
    rl, compute = preset.rl, compute or contextlib.nullcontext
    device = next(model.parameters()).device
    packed = packing.supported(model) if packed is None else packed
    batch = RolloutBatch.build(groups, preset, pad_id, device, packed)
    adv = _advantages(rewards, accuracy, rl.advantage, device)  # [N], one per rollout
    steps = micro_batches(groups, rl.mini_batches)  # optimizer steps, each a list of forwards
    mine = rank_share(steps, distributed.world_size(), distributed.rank())  # this rank's forwards
    old = _old_logprobs(model, batch, mine, compute)  # [N, W] pi_old, filled for steps 2.. now
    ref = _reference_logprobs(model, batch, mine, compute, reference) if reference is not None and rl.kl_coef > 0 else None
    tis = rl.tis_cap is not None and any(batch.has_sampler_lp)
    params = [p for p in model.parameters() if p.requires_grad]
    stats: dict[str, list[float]] = {k: [] for k in ("loss", "clip_frac", "ratio_mean", "approx_kl", "high_ratio_frac")}
    norms = []  # per optimizer step: grad_norm_pg (and grad_norm_sft)
    model.train()  # gradient checkpointing (GPU presets) is only active in train mode
    for k, step in enumerate(steps):
        optimizer.zero_grad()
        n_tokens, n_sequences = batch.trained_tokens(step), float(sum(len(sub) for sub in step))
        for sub in mine[k]:
            t = batch.index(sub)
            with compute():
                logp = batch.logprobs(model, sub)  # [B, W], with gradient
            if k == 0:  # before any update this forward IS the sampling policy: its ratio is exactly 1
                old[t] = logp.detach().float()
            weights = _tis_weights(batch, t, old[t], rl.tis_cap, stats) if tis else None  # [B, W] or None
            loss, st = dapo.dapo_token_loss(logp, old[t], adv[t], batch.loss_mask[t], rl.clip_low, rl.clip_high,
                                            n_tokens=n_tokens, aggregation=rl.loss_agg, n_sequences=n_sequences,
                                            token_weights=weights, kl_coef=rl.kl_coef,
                                            ref_logprobs=ref[t] if ref is not None else None)
            _backward(rl.pg_coef * loss, scaler)  # rl.pg_coef: the policy-gradient term's weight (1: RL)
            _log_loss(stats, loss, st)
        held = _add_sft_loss(model, params, sft_batches, k, preset, pad_id, packed, device, compute, scaler, stats)
        distributed.all_reduce_gradients(params)  # the whole mini-batch's gradient on every rank
        norms.append(_term_norms(params, held, scaler))
        _step(optimizer, params, scaler, scheduler)
    return _summary(stats, batch, old, mine, len(steps), norms)


def _backward(loss, scaler) -> None:
    """loss.backward(), through fp16's loss scaler when one is on (models.grad_scaler)."""
    (scaler.scale(loss) if scaler is not None else loss).backward()


def _step(optimizer, params, scaler, scheduler=None) -> None:
    """Clip the gradient norm to 1 and step; under fp16 loss scaling the gradients are unscaled
    first, and a step whose gradients overflowed is skipped (the scaler lowers its scale). The
    learning-rate schedule (rl/optim.py) then moves on one optimizer step."""
    if scaler is not None and scaler.is_enabled():
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        scaler.step(optimizer)
        scaler.update()
    else:
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
    if scheduler is not None:
        scheduler.step()


class _Held:
    """A gradient held apart from its parameter, in the shape distributed.all_reduce_gradients takes."""

    def __init__(self, p):
        self.grad = p.grad.detach().clone() if p.grad is not None else p.detach().new_zeros(p.shape)


def _term_norms(params, pg: list[_Held] | None, scaler) -> dict[str, float]:
    """‖∇‖ before clipping of the policy-gradient term and of the SFT mix, from the mini-batch's
    summed gradient (already reduced over ranks) and `pg`, the gradient held after the policy term's
    backward and before the mix's (None: no mix ran, the whole gradient is the policy term's). Under
    data parallel the held copy is reduced too: one more collective, only with the mix on. The
    backward passes are today's: reading the norms changes nothing in the update."""
    scale = scaler.get_scale() if scaler is not None and scaler.is_enabled() else 1.0  # fp16: scaled grads
    if pg is None:
        return {"grad_norm_pg": optim.grad_norm([p.grad for p in params]) / scale}
    distributed.all_reduce_gradients(pg)
    sft = [p.grad - h.grad if p.grad is not None else None for p, h in zip(params, pg)]
    return {"grad_norm_pg": optim.grad_norm([h.grad for h in pg]) / scale, "grad_norm_sft": optim.grad_norm(sft) / scale}


def _mean_rows(rows: list[dict]) -> dict[str, float]:
    """The mean of each key over per-mini-batch rows (the norms are the same on every rank)."""
    return {k: sum(r[k] for r in rows) / len(rows) for k in (rows[0] if rows else {})}


def _sft_mix(model, rows: list[dict], coef: float, pad_id: int, packed: bool, device, compute, world: int,
             me: int, scaler=None) -> float:
    """Backward of coef x the masked SFT loss (the mean over every labelled token of `rows`, as
    in SFT) into the gradients the policy loss left; this rank takes rows me, me + world, ... so
    the ranks' summed gradient is the whole batch's. Returns the loss (this rank's share)."""
    labelled = sum(sum(1 for x in r["labels"][1:] if x != IGNORE_INDEX) for r in rows)
    share = rows[me::world]
    if not share or not labelled:
        return 0.0
    batch = (pack_batch if packed else pad_batch)(share, pad_id)
    batch = {k: v.to(device) for k, v in batch.items()}
    with compute():
        loss = masked_lm_loss(model, batch, num_items_in_batch=torch.tensor(labelled, device=device))
    _backward(coef * loss, scaler)
    return float(loss.detach())


def _advantages(rewards, accuracy, mode: str, device) -> torch.Tensor:
    """[N] advantages of the flattened rollouts, group after group (dapo.advantages, rl.advantage)."""
    acc = torch.tensor(accuracy, dtype=torch.float32) if accuracy is not None else None
    return dapo.advantages(torch.tensor(rewards, dtype=torch.float32), mode, acc).flatten().to(device)


def _old_logprobs(model, batch: RolloutBatch, mine, compute) -> torch.Tensor:
    """[N, W] the pre-update log-probs. The first mini-batch is trained before any update, so its
    own forward gives them (policy_update fills its rows); only the later mini-batches need a no-grad
    pass now, before the weights move (at rl.mini_batches = 1 there is none)."""
    old = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)
    model.eval()  # no dropout: old and new log-probs must come from the same function
    with torch.no_grad(), compute():
        for sub in (sub for mb in mine[1:] for sub in mb):
            old[batch.index(sub)] = batch.logprobs(model, sub).float()
    return old


def _reference_logprobs(model, batch: RolloutBatch, mine, compute, reference) -> torch.Tensor:
    """[N, W] the SFT policy's log-probs for the KL term: one more no-grad pass, the reference
    weights swapped in."""
    ref = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=batch.input_ids.device)
    with torch.no_grad(), compute(), reference.active():
        for sub in (sub for mb in mine for sub in mb):
            ref[batch.index(sub)] = batch.logprobs(model, sub).float()
    return ref


def _tis_weights(batch: RolloutBatch, t, old_t, cap: float, stats: dict) -> torch.Tensor:
    """Truncated importance sampling: each policy token's loss weighed by min(pi_train / pi_rollout,
    cap) (dapo.tis_weights), pi_train the pre-update policy and pi_rollout the probability the
    sampler drew the token with. Whoever sampled, not only the int8 copy: under bf16 autocast the
    exact sampler runs LoRA merged into its weights and the trainer unmerged, a small gap nothing
    else corrects. Every sampler reports its log-probs (the lab's decoder, the int8 copy, vLLM in
    process and served); a rollout without them (an older server) keeps weight 1."""
    weights, capped = dapo.tis_weights(old_t, batch.sampler_logprobs[t], batch.sampler_mask[t], cap)
    on = batch.loss_mask[t].float()
    n_on = on.sum().clamp(min=1)
    stats.setdefault("tis_capped_frac", []).append(float((capped.float() * on).sum() / n_on))
    stats.setdefault("tis_weight_mean", []).append(float((weights * on).sum() / n_on))
    return weights


def _log_loss(stats: dict, loss, st: dict) -> None:
    stats["loss"].append(float(loss.detach()))
    if "kl_ref" in st:
        stats.setdefault("kl_ref", []).append(st["kl_ref"])
    for k in ("clip_frac", "ratio_mean", "approx_kl", "high_ratio_frac"):
        stats[k].append(st[k])


def _add_sft_loss(model, params, sft_batches, k: int, preset: Preset, pad_id: int, packed: bool, device, compute,
                  scaler, stats: dict) -> list[_Held] | None:
    """PPO-ptx: rl.sft_coef x the masked SFT loss on this optimizer step's SFT rows, added to the
    gradients the policy term left. Returns the policy term's gradient held apart first (for its
    norm), or None when no mix runs this step."""
    rl = preset.rl
    if not (sft_batches and rl.sft_coef > 0 and k < len(sft_batches)):
        return None
    held = [_Held(p) for p in params]
    world, me = distributed.world_size(), distributed.rank()
    stats.setdefault("sft_loss", []).append(_sft_mix(model, sft_batches[k], rl.sft_coef, pad_id, packed, device,
                                                    compute, world, me, scaler))
    return held


def _sampler_gap(batch: RolloutBatch, mine, old) -> tuple[float, float, float]:
    """Consistency: `old` holds the trainer's pre-update log-prob of every token this rank scored.
    On policy tokens it must equal the log-prob the sampler drew the token with (same weights, same
    temperature): verl's rollout_probs_diff_mean, over every policy token, the overlong-filtered
    samples included. Returns (sum, count, max) of |p_trainer - p_sampler| on this rank."""
    scored = sorted({i for mb in mine for sub in mb for i in sub})
    with_lp = [i for i in scored if batch.has_sampler_lp[i]]
    if not with_lp:
        return 0.0, 0.0, 0.0
    t = batch.index(with_lp)
    gap = dapo.probability_gap(old[t], batch.sampler_logprobs[t], batch.sampler_mask[t])
    return float(gap.sum()), float(gap.numel()), float(gap.max()) if gap.numel() else 0.0


def _summary(stats: dict, batch: RolloutBatch, old, mine, n_steps: int, norms: list[dict]) -> dict:
    """The step's row: per-micro-batch statistics as sums and counts over all ranks (the log is one
    process's), the sampler/trainer gap, the gradient norms and the token counts."""
    gap_sum, gap_n, gap_max = _sampler_gap(batch, mine, old)
    keys = list(stats)
    totals = distributed.all_reduce_sum([sum(stats[k]) for k in keys] + [gap_sum, gap_n]
                                        + [float(len(stats["clip_frac"]))])
    count = totals[-1]
    out = {k: (totals[i] / count if count else 0.0) for i, k in enumerate(keys)}
    if totals[-2] > 0:  # no rollout with sampler log-probs (an old server that ignores logprobs=0): left out
        out["logprob_gap"] = totals[-3] / totals[-2]  # mean |p_trainer - p_sampler| per policy token
        out["logprob_gap_max"] = gap_max  # this rank's largest
    out["loss"] = totals[keys.index("loss")] / max(1, n_steps)
    if "sft_loss" in stats:  # the ranks' shares add up to each mini-batch's loss: the mean over them
        out["sft_loss"] = totals[keys.index("sft_loss")] / len(stats["sft_loss"])
    out["optimizer_steps"] = n_steps  # the SFT-only control arm takes as many (rl.mini_batches)
    out.update(_mean_rows(norms))
    out["train_tokens"] = int(batch.loss_mask.sum())
    out["masked_observation_tokens"] = batch.observation_tokens()
    return out


def sft_only_update(model, optimizer, sft_batches: list[list[dict]], preset: Preset, pad_id: int,
                    compute=None, packed: bool | None = None, scaler=None, scheduler=None) -> dict:
    """The SFT-only control of an RL step (rl.pg_coef = 0): the optimizer steps `policy_update`
    would take, one per mini-batch of SFT rows, each on rl.sft_coef x the masked SFT loss alone,
    clipped and stepped exactly as there. Nothing is sampled: what this arm gains over the SFT
    adapter is what more SFT gives, the bar RL's own gain is measured against."""
    compute = compute or contextlib.nullcontext
    device = next(model.parameters()).device
    packed = packing.supported(model) if packed is None else packed
    world, me = distributed.world_size(), distributed.rank()
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    losses, norms = [], []
    for rows in sft_batches:
        optimizer.zero_grad()
        losses.append(_sft_mix(model, rows, preset.rl.sft_coef, pad_id, packed, device, compute, world, me, scaler))
        distributed.all_reduce_gradients(params)
        scale = scaler.get_scale() if scaler is not None and scaler.is_enabled() else 1.0
        norms.append({"grad_norm_pg": 0.0, "grad_norm_sft": optim.grad_norm([p.grad for p in params]) / scale})
        _step(optimizer, params, scaler, scheduler)
    total = distributed.all_reduce_sum([sum(losses)])[0]
    return {"sft_loss": total / max(1, len(losses)), "optimizer_steps": len(losses), **_mean_rows(norms)}
