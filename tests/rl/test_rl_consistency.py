"""RL trains the policy that sampled: the trainer's log-prob of every sampled token equals the
sampler's (same weights, same temperature); a rollout cut by the per-turn cap stays in the loss;
old log-probs are the pre-update policy's; a resumed run samples exactly as the uninterrupted one.
Real model, real sampling (no scripted policy) wherever the claim is about sampling."""

import copy
import math

import pytest
import torch

from coa_lab.training import lm_head, logprobs, packing
from coa_lab.student_rollout import run_coa
from coa_lab.config import get_preset
from coa_lab.generation.hf_generator import HFGenerator
from coa_lab.generation.models import load_model
from coa_lab.generation.result import Generation
from coa_lab.rl import dapo, update
from coa_lab.rl.rollouts import collect_batch
from coa_lab.rl.trainer import train_rl
from coa_lab.rl.update import policy_update
from coa_lab.tasks.records import Task
from coa_lab.tools.registry import build_tools
from coa_lab.trajectories import load_records

pytestmark = pytest.mark.model

TASK = Task("c1", "What is 17 + 25?", ["42"], "test", "math", {})
T_SAMPLE = 0.7  # not 1: the bug this file guards against is invisible at T = 1


def _preset(**rl):
    # fp32 on every machine: bf16 autocast would add its own (legitimate) rounding gap
    return get_preset("cpu-smoke", model={"cpu_autocast_bf16": False}, rl={"temperature": T_SAMPLE, **rl},
                      gen={"max_new_tokens": 24, "max_turns": 1, "max_response_tokens": 64})


@pytest.fixture(scope="module")
def policy():
    """The embedded model with a LoRA adapter that really changes its outputs (B != 0)."""
    torch.manual_seed(0)
    model, tok = load_model(_preset().model, trainable=True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    return model, tok


@pytest.fixture(scope="module")
def sampled(policy):
    model, tok = policy
    torch.manual_seed(1)
    preset = _preset()
    rollouts = run_coa(HFGenerator(model, tok, batch_size=8), [TASK], build_tools(["code"]), preset.gen,
                       samples=4, temperature=T_SAMPLE)
    assert all(len(r.response_logprobs) == len(r.response_ids) > 0 for r in rollouts)
    return rollouts


def _trainer_logprobs(model, rollouts, pad_id, temperature):
    seqs = [r.prompt_ids + r.response_ids for r in rollouts]
    with torch.no_grad():
        packed = packing.sequence_logprobs(model, seqs, [list(range(len(seqs)))], [len(r.prompt_ids) for r in rollouts],
                                           pad_id, temperature=temperature)
        width = packed.shape[1]
        ids = torch.tensor([s + [pad_id] * (width - len(s)) for s in seqs])
        attention = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
        padded = logprobs.token_logprobs(model, ids, attention, min(len(r.prompt_ids) for r in rollouts),
                                     temperature=temperature)
    return packed, padded


def _gap(logprobs, rollouts):
    gaps = []
    for k, r in enumerate(rollouts):
        n = len(r.prompt_ids)
        for j, (lp, m) in enumerate(zip(r.response_logprobs, r.response_mask)):
            if m:
                gaps.append(abs(float(logprobs[k, n + j].exp()) - torch.tensor(lp).exp().item()))
    return sum(gaps) / len(gaps), max(gaps)


def test_trainer_logprobs_equal_the_samplers_at_the_sampling_temperature(policy, sampled):
    model, tok = policy
    for logprobs in _trainer_logprobs(model, sampled, tok.pad_token_id, T_SAMPLE):  # packed and padded
        mean, worst = _gap(logprobs, sampled)
        assert mean < 1e-4 and worst < 1e-3, (mean, worst)
    # negative control: scored at T = 1 (the old trainer), the same tokens are another policy's
    packed, _ = _trainer_logprobs(model, sampled, tok.pad_token_id, 1.0)
    mean, _ = _gap(packed, sampled)
    assert mean > 0.01, mean


def test_policy_update_logs_the_gap_and_it_exposes_a_temperature_mismatch(policy, sampled):
    model, tok = policy
    groups, rewards = [sampled[:2], sampled[2:]], [[1.0, 0.0], [0.0, 1.0]]
    for temperature, expect_small in ((T_SAMPLE, True), (1.0, False)):
        m = copy.deepcopy(model)
        opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4)
        stats = policy_update(m, opt, groups, rewards, _preset(temperature=temperature, mini_batches=2), tok.pad_token_id)
        assert (stats["logprob_gap"] < 0.005) is expect_small, (temperature, stats["logprob_gap"])
    with pytest.raises(ValueError, match="temperature"):
        lm_head.check_temperature(0.0)


class Scripted:
    """Rollout i writes outputs[i % n] and ends that turn with finishes[i % n]."""

    def __init__(self, tokenizer, outputs, finishes):
        self.tokenizer, self.outputs, self.finishes = tokenizer, outputs, finishes

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stop=()):
        out = []
        for i, p in enumerate(prompts):
            ids = self.tokenizer(self.outputs[i % len(self.outputs)], add_special_tokens=False)["input_ids"]
            out.append(Generation(ids, self.tokenizer.decode(ids), self.finishes[i % len(self.finishes)], len(p)))
        return out


def test_a_rollout_cut_by_the_turn_cap_reaches_the_loss_with_negative_advantage(policy, monkeypatch):
    model, tok = policy
    loop = "<think>I add the numbers. I add the numbers. I add the numbers. I add the"  # cut mid-loop
    preset = _preset(prompts_per_step=1, group_size=2, max_sampling_rounds=0, overlong_filter=True)
    policy_ = Scripted(tok, ["<think>t</think><answer>\\boxed{42}</answer>", loop], ["stop", "length"])
    groups, rewards, _ = collect_batch(policy_, iter([TASK]), build_tools(["code"]), preset)
    [[right, looped]] = groups
    assert looped.finish == "turn_length" and not looped.truncated  # a per-turn cut is not "overlong"
    assert rewards == [[1.0, 0.0]]
    seen = []
    real = dapo.dapo_token_loss

    def spy(logprobs, old, advantages, mask, *args, **kwargs):
        seen.append((advantages.detach().clone(), mask.detach().clone()))
        return real(logprobs, old, advantages, mask, *args, **kwargs)

    monkeypatch.setattr(dapo, "dapo_token_loss", spy)
    m = copy.deepcopy(model)
    policy_update(m, torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4), groups, rewards,
                  preset, tok.pad_token_id)
    [(adv, mask)] = seen
    assert adv[1] < 0 < adv[0]
    assert int(mask[1].sum()) == sum(looped.response_mask) > 0  # every token of the loop is trained against

    # the response budget is another matter: there DAPO's overlong filter (a switch) masks the sample
    looped.truncated = True
    seen.clear()
    policy_update(m, torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4), groups, rewards,
                  preset, tok.pad_token_id)
    assert int(seen[0][1][1].sum()) == 0
    seen.clear()
    policy_update(m, torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4), groups, rewards,
                  _preset(overlong_filter=False), tok.pad_token_id)
    assert int(seen[0][1][1].sum()) == sum(looped.response_mask)


def test_old_logprobs_are_the_pre_update_policys_values(policy, sampled, monkeypatch):
    model, tok = policy
    m = copy.deepcopy(model)
    before = copy.deepcopy(model)
    groups, rewards = [sampled[:2], sampled[2:]], [[1.0, 0.0], [0.0, 1.0]]
    # mini-batch 0 trains group 0, mini-batch 1 group 1: group 1's old log-probs must be taken
    # BEFORE mini-batch 0's optimizer step moved the weights
    monkeypatch.setattr(update, "micro_batches", lambda groups_, n: [[[0, 1]], [[2, 3]]])
    seen = []
    real = dapo.dapo_token_loss

    def spy(logprobs, old, *args, **kwargs):
        seen.append(old.detach().clone())
        return real(logprobs, old, *args, **kwargs)

    monkeypatch.setattr(dapo, "dapo_token_loss", spy)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=5e-3)
    policy_update(m, opt, groups, rewards, _preset(mini_batches=2), tok.pad_token_id)
    assert len(seen) == 2
    pre, _ = _trainer_logprobs(before, sampled[2:], tok.pad_token_id, T_SAMPLE)
    post, _ = _trainer_logprobs(m, sampled[2:], tok.pad_token_id, T_SAMPLE)
    width = pre.shape[1]
    mask = torch.tensor([[0] * len(r.prompt_ids) + r.response_mask + [0] * (width - len(r.prompt_ids) - len(r.response_ids))
                         for r in sampled[2:]]).bool()
    old = seen[1][:, :width]
    assert torch.allclose(old[mask], pre[mask], atol=1e-5)
    # and the test can tell: after the step the same tokens have visibly other log-probs
    assert (post[mask] - pre[mask]).abs().max() > 1e-3


def test_tis_weighs_exact_rollouts_by_the_capped_ratio_token_by_token(policy, sampled, monkeypatch):
    """Truncated importance sampling applies to the exact sampler's rollouts too (rl.rollout_int8
    off): each policy token's loss weight is exp(min(old - sampler_lp, log cap)), recomputed here
    token by token; every other token weighs 1. The sampler's log-probs are moved by hand so that
    some tokens hit the cap (ratio ~e) and others weigh below 1."""
    model, tok = policy
    rollouts = copy.deepcopy(sampled)
    for r in rollouts:
        policy_pos = [j for j, m in enumerate(r.response_mask) if m]
        for k, j in enumerate(policy_pos):
            r.response_logprobs[j] = r.response_logprobs[j] - 1.0 if k % 2 == 0 else r.response_logprobs[j] / 2
    seen = []
    real = dapo.dapo_token_loss

    def spy(logprobs, old, advantages, mask, *args, token_weights=None, **kwargs):
        seen.append((old.detach().clone(), mask.detach().clone(), token_weights))
        return real(logprobs, old, advantages, mask, *args, token_weights=token_weights, **kwargs)

    monkeypatch.setattr(dapo, "dapo_token_loss", spy)
    preset = _preset(mini_batches=1)
    assert not preset.rl.rollout_int8 and preset.rl.tis_cap == 2.0
    m = copy.deepcopy(model)
    stats = policy_update(m, torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4),
                          [rollouts], [[1.0, 0.0, 0.0, 1.0]], preset, tok.pad_token_id)
    [(old, loss_mask, weights)] = seen  # one group of 4: one micro-batch, rows in rollout order
    assert weights is not None
    log_w = torch.zeros_like(old)  # 0 (weight 1) wherever the policy sampled nothing
    for k, r in enumerate(rollouts):
        n = len(r.prompt_ids)
        for j, (is_policy, lp) in enumerate(zip(r.response_mask, r.response_logprobs)):
            if is_policy:
                log_w[k, n + j] = old[k, n + j] - torch.tensor(lp, dtype=torch.float32)
    expected = torch.exp(log_w.clamp(max=math.log(2.0)))
    assert torch.equal(weights, expected)
    on = loss_mask.bool()
    assert (log_w[on] > math.log(2.0)).any() and (expected[on] < 0.99).any()  # both ends are exercised
    assert stats["tis_weight_mean"] == pytest.approx(float(expected[on].mean()), rel=1e-6)
    assert stats["tis_capped_frac"] == pytest.approx(float((log_w[on] > math.log(2.0)).float().mean()), rel=1e-6)


def test_exact_rollouts_in_fp32_get_tis_weights_of_1(policy, sampled):
    """fp32, the policy itself sampling: the trainer's log-probs are the sampler's, so truncated
    importance sampling, now on for exact rollouts, weighs every token 1 and caps none."""
    model, tok = policy
    m = copy.deepcopy(model)
    stats = policy_update(m, torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4),
                          [sampled[:2], sampled[2:]], [[1.0, 0.0], [0.0, 1.0]], _preset(mini_batches=2),
                          tok.pad_token_id)
    assert stats["tis_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert stats["tis_capped_frac"] == 0.0


def test_resumed_rl_samples_what_the_uninterrupted_run_sampled(tmp_path, monkeypatch):
    # the real model samples (no scripted policy): the rollouts depend on the RNG state
    preset = _preset(steps=2, prompts_per_step=1, group_size=2, max_sampling_rounds=0, save_steps=1)
    tasks = [Task(f"r{i}", f"What is {i}3 + {i}9?", [str(i * 20 + 12)], "test", "math", {}) for i in range(1, 4)]
    tools = build_tools(["code"])
    train_rl(preset, tasks, tools, tmp_path / "straight")
    straight = [r.text for r in load_records(tmp_path / "straight" / "rollouts.jsonl") if r.metadata["step"] == 1]

    class Interrupted(Exception):
        pass

    def stop_at_step_1(step, row, model):
        if step == 1:
            raise Interrupted

    with pytest.raises(Interrupted):
        train_rl(preset, tasks, tools, tmp_path / "cut", on_step=stop_at_step_1)
    import shutil

    shutil.copytree(tmp_path / "cut", tmp_path / "amnesia")
    train_rl(preset, tasks, tools, tmp_path / "cut", resume=True)
    resumed = [r.text for r in load_records(tmp_path / "cut" / "rollouts.jsonl") if r.metadata["step"] == 1]
    assert resumed == straight and len(straight) == 2

    # negative control: the same resume with the torch RNG left as the fresh process has it
    monkeypatch.setattr(torch, "set_rng_state", lambda state: None)
    train_rl(preset, tasks, tools, tmp_path / "amnesia", resume=True)
    forgetful = [r.text for r in load_records(tmp_path / "amnesia" / "rollouts.jsonl") if r.metadata["step"] == 1]
    assert forgetful != straight
