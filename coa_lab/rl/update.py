"""RL's update half (steps 4-5 of rl/trainer.py): GRPO advantages, old log-probs, then
mini-batch optimizer steps on DAPO's clip-higher, token-level loss over policy tokens only.
Under `accelerate launch` each rank computes its share of the micro-batches and the gradients
are summed (coa_lab/distributed.py)."""

from __future__ import annotations

import random

from coa_lab import distributed
from coa_lab.config import Preset
from coa_lab.rl import dapo, optim
from coa_lab.training.logprobs import token_logprobs


def _pad(rows: list[list[int]], value: int):
    import torch

    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows])


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


def _backward(loss, scaler) -> None:
    """loss.backward(), through fp16's loss scaler when one is on (models.grad_scaler)."""
    (scaler.scale(loss) if scaler is not None else loss).backward()


def _step(optimizer, params, scaler, scheduler=None) -> None:
    """Clip the gradient norm to 1 and step; under fp16 loss scaling the gradients are unscaled
    first, and a step whose gradients overflowed is skipped (the scaler lowers its scale). The
    learning-rate schedule (rl/optim.py) then moves on one optimizer step."""
    import torch

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
    import torch

    from coa_lab.training.sft import IGNORE_INDEX, masked_lm_loss, pack_batch, pad_batch

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


def _sampler_gap(flat, mine, old, device) -> tuple[float, float, float]:
    """Consistency: `old` holds the trainer's pre-update log-prob of every token this rank scored.
    On policy tokens it must equal the log-prob the sampler drew the token with (same weights, same
    temperature): verl's rollout_probs_diff_mean, over every policy token, the overlong-filtered
    samples included. Returns (sum, count, max) of |p_trainer - p_sampler| on this rank."""
    import torch

    scored = sorted({i for mb in mine for sub in mb for i in sub})
    with_lp = [i for i in scored if len(flat[i].response_logprobs) == len(flat[i].response_ids)]
    if not with_lp:
        return 0.0, 0.0, 0.0
    t = torch.tensor(with_lp, device=device)
    sampler = _pad([[0.0] * len(flat[i].prompt_ids) + flat[i].response_logprobs for i in with_lp], 0.0)
    policy = _pad([[0] * len(flat[i].prompt_ids) + flat[i].response_mask for i in with_lp], 0)
    width_lp = sampler.shape[1]
    gap = dapo.probability_gap(old[t, :width_lp], sampler.to(device), policy.to(device))
    return float(gap.sum()), float(gap.numel()), float(gap.max()) if gap.numel() else 0.0


def policy_update(model, optimizer, groups, rewards, preset: Preset, pad_id: int, compute=None,
                  packed: bool | None = None, reference=None, sft_batches: list[list[dict]] | None = None,
                  scaler=None, scheduler=None, accuracy: list[list[float]] | None = None) -> dict:
    """Old log-probs, advantages, then mini-batch steps on the DAPO loss.

    compute: a context-manager factory for forward passes (bf16 autocast on CPU).
    reference: rl/reference.ReferenceWeights, the SFT policy of the KL term (rl.kl_coef > 0).
    sft_batches: with rl.sft_coef > 0, one list of encoded SFT rows (sft.encode_example) per
    mini-batch: rl.sft_coef x their masked SFT loss joins that optimizer step (PPO-ptx).
    packed: one packed row per micro-batch (default: wherever the model's attention allows
    it) or padded rows (benchmarks/bench_rl_update.py compares them).
    scheduler: the learning-rate schedule, stepped after every optimizer step (rl/optim.py).
    accuracy: the binary task reward of each rollout, like `rewards` (the shaped ones): what
    rl.advantage = "rft" calls correct (default: `rewards`)."""
    import contextlib

    import torch

    from coa_lab.training import packing

    compute = compute or contextlib.nullcontext
    rl = preset.rl
    device = next(model.parameters()).device
    acc = torch.tensor(accuracy, dtype=torch.float32) if accuracy is not None else None
    adv = dapo.advantages(torch.tensor(rewards, dtype=torch.float32), rl.advantage, acc).flatten().to(device)  # [N]
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
        if packed:  # the shared prompt once, no padding (coa_lab/training/packing.py)
            return packing.sequence_logprobs(model, [ids[i] for i in sub], [list(range(len(sub)))],
                                             [len(flat[i].prompt_ids) for i in sub], pad_id, width,
                                             temperature=rl.temperature)
        # padded to the micro-batch's longest; no prompt token is in the loss: skip their logits
        t, longest = torch.tensor(sub, device=device), max(len(ids[i]) for i in sub)
        out = token_logprobs(model, input_ids[t, :longest], attention[t, :longest],
                             min(len(flat[i].prompt_ids) for i in sub), temperature=rl.temperature)
        return torch.nn.functional.pad(out, (0, width - longest))

    # Truncated importance sampling: each policy token's loss weighed by min(pi_train / pi_rollout,
    # tis_cap) (dapo.tis_weights), pi_train being the pre-update policy (`old` below) and
    # pi_rollout the probability the sampler drew the token with. Whoever sampled, not only the
    # int8 copy: under bf16 autocast the exact sampler runs LoRA merged into its weights and the
    # trainer unmerged, a small gap nothing else corrects (in fp32 the weights are 1 to float
    # precision). Every sampler reports them: the in-process vLLM engine asks for logprobs=0 after
    # temperature (logprobs_mode processed_logprobs), the server client asks too, so TIS runs on the
    # GPU presets; a rollout that still has none (an older server) keeps weight 1 on every token.
    has_lp = [len(r.response_logprobs) == len(r.response_ids) for r in flat]
    tis = rl.tis_cap is not None and any(has_lp)
    if tis:
        sampler_lp = _pad([[0.0] * len(r.prompt_ids) + (r.response_logprobs if ok else [0.0] * len(r.response_ids))
                           for r, ok in zip(flat, has_lp)], 0.0).to(device)
        tis_mask = _pad([[0] * len(r.prompt_ids) + (r.response_mask if ok else [0] * len(r.response_ids))
                         for r, ok in zip(flat, has_lp)], 0).to(device)
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
    norms = []  # per mini-batch: grad_norm_pg (and grad_norm_sft)
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
                weights, capped = dapo.tis_weights(old_sub, sampler_lp[t], tis_mask[t], rl.tis_cap)
                on = loss_mask[t].float()
                n_on = on.sum().clamp(min=1)
                stats.setdefault("tis_capped_frac", []).append(float((capped.float() * on).sum() / n_on))
                stats.setdefault("tis_weight_mean", []).append(float((weights * on).sum() / n_on))
            loss, st = dapo.dapo_token_loss(logp, old_sub, adv[t], loss_mask[t],
                                            rl.clip_low, rl.clip_high, n_tokens=n_tokens,
                                            aggregation=rl.loss_agg, n_sequences=n_sequences,
                                            token_weights=weights,
                                            ref_logprobs=ref[t] if ref is not None else None, kl_coef=rl.kl_coef)
            _backward(rl.pg_coef * loss, scaler)  # rl.pg_coef: the policy-gradient term's weight (1: RL)
            stats["loss"].append(float(loss.detach()))
            if "kl_ref" in st:
                stats.setdefault("kl_ref", []).append(st["kl_ref"])
            for k in ("clip_frac", "ratio_mean", "approx_kl", "high_ratio_frac"):
                stats[k].append(st[k])
        mix = bool(sft_batches) and rl.sft_coef > 0 and n_mb < len(sft_batches)
        pg_grads = [_Held(p) for p in params] if mix else None  # the policy term's alone, for its norm
        if mix:
            stats.setdefault("sft_loss", []).append(_sft_mix(model, sft_batches[n_mb], rl.sft_coef, pad_id, packed,
                                                            device, compute, world, me, scaler))
        distributed.all_reduce_gradients(params)  # the whole mini-batch's gradient on every rank
        norms.append(_term_norms(params, pg_grads, scaler))
        _step(optimizer, params, scaler, scheduler)
    gap_sum, gap_n, gap_max = _sampler_gap(flat, mine, old, device)
    # per-micro-batch statistics: sums and counts over all ranks, so the log is one process's
    keys = list(stats)
    totals = distributed.all_reduce_sum([sum(stats[k]) for k in keys] + [gap_sum, gap_n]
                                        + [float(len(stats["clip_frac"]))])
    count = totals[-1]
    out = {k: (totals[i] / count if count else 0.0) for i, k in enumerate(keys)}
    if totals[-2] > 0:  # no rollout with sampler log-probs (an old server that ignores logprobs=0): left out
        out["logprob_gap"] = totals[-3] / totals[-2]  # mean |p_trainer - p_sampler| per policy token
        out["logprob_gap_max"] = gap_max  # this rank's largest
    out["loss"] = totals[keys.index("loss")] / max(1, len(mini_batches))
    if "sft_loss" in stats:  # the ranks' shares add up to each mini-batch's loss: the mean over them
        out["sft_loss"] = totals[keys.index("sft_loss")] / len(stats["sft_loss"])
    out["optimizer_steps"] = len(mini_batches)  # the SFT-only control arm takes as many (rl.mini_batches)
    out.update(_mean_rows(norms))
    out["train_tokens"] = int(loss_mask.sum())
    out["masked_observation_tokens"] = sum(len(r.response_mask) - sum(r.response_mask) for r in flat)
    return out


def sft_only_update(model, optimizer, sft_batches: list[list[dict]], preset: Preset, pad_id: int,
                    compute=None, packed: bool | None = None, scaler=None, scheduler=None) -> dict:
    """The SFT-only control of an RL step (rl.pg_coef = 0): the optimizer steps `policy_update`
    would take, one per mini-batch of SFT rows, each on rl.sft_coef x the masked SFT loss alone,
    clipped and stepped exactly as there. Nothing is sampled: what this arm gains over the SFT
    adapter is what more SFT gives, the bar RL's own gain is measured against."""
    import contextlib


    from coa_lab.training import packing

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
