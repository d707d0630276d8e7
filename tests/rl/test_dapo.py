"""coa_lab/rl/dapo.py: GRPO advantages, dynamic sampling, soft overlong punishment, the
token-level clip-higher loss (values AND gradients), and token_logprobs on a tiny model."""

from __future__ import annotations

import math

import pytest
import torch

from coa_lab.rl.dapo import (
    dapo_token_loss,
    group_advantages,
    informative_groups,
    overlong_penalty,
    tis_weights,
)
from coa_lab.training.logprobs import token_logprobs

# ============================================================================ advantages


def test_group_advantages_hand_values():
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]]))
    # group 0: mean .5, population std .5 -> +-1
    assert torch.allclose(adv[0], torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-5)
    # group 1: mean .25, std sqrt(.25 * .75)
    std = math.sqrt(0.25 * 0.75)
    assert torch.allclose(adv[1], torch.tensor([0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std]), atol=1e-5)


def test_group_advantages_zero_mean_unit_std_per_group():
    torch.manual_seed(0)
    rewards = torch.rand(5, 8)
    adv = group_advantages(rewards)
    assert adv.shape == rewards.shape
    assert torch.allclose(adv.mean(dim=1), torch.zeros(5), atol=1e-5)
    assert torch.allclose(adv.std(dim=1, unbiased=False), torch.ones(5), atol=1e-4)
    # standardisation is per group: shifting one group does not change any advantage
    shifted = rewards.clone()
    shifted[2] += 10.0
    assert torch.allclose(group_advantages(shifted), adv, atol=1e-4)


def test_group_advantages_all_equal_group_is_zero():
    adv = group_advantages(torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))
    assert torch.equal(adv[0], torch.zeros(3))
    assert torch.equal(adv[1], torch.zeros(3))
    assert torch.isfinite(adv).all()
    assert adv[2, 1] > 0 > adv[2, 0]


def test_informative_groups():
    rewards = torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 1.0], [0.5, 0.5], [1.0, 0.0]])
    assert informative_groups(rewards).tolist() == [False, False, True, False, True]
    assert informative_groups(rewards).dtype == torch.bool


# ============================================================================ overlong


def test_overlong_penalty_three_regions():
    max_len, buffer = 100, 20  # buffer starts at 80
    lengths = torch.tensor([0, 50, 79, 80, 81, 90, 99, 100, 101, 150])
    got = overlong_penalty(lengths, max_len, buffer)
    want = torch.tensor([0, 0, 0, 0, -0.05, -0.5, -0.95, -1.0, -1.0, -1.0])
    assert torch.allclose(got, want, atol=1e-6)
    assert got.dtype.is_floating_point


def test_overlong_penalty_matches_dapo_formula():
    max_len, buffer = 512, 128
    for L in range(0, 700, 7):
        got = float(overlong_penalty(torch.tensor([L]), max_len, buffer)[0])
        if L <= max_len - buffer:
            want = 0.0
        elif L <= max_len:
            want = ((max_len - buffer) - L) / buffer
        else:
            want = -1.0
        assert got == pytest.approx(want, abs=1e-6), L


def test_overlong_penalty_zero_buffer():
    got = overlong_penalty(torch.tensor([99, 100, 101]), 100, 0)
    assert got.tolist() == [0.0, 0.0, -1.0]


# ============================================================================ loss


def _loss(logprobs, old, adv, mask, **kw):
    return dapo_token_loss(logprobs, old, torch.tensor(adv, dtype=torch.float), torch.tensor(mask), **kw)


def test_ratio_one_loss_is_token_weighted_mean_advantage():
    mask = [[1, 1, 1, 0], [1, 0, 0, 0]]
    lp = torch.full((2, 4), -1.3)
    loss, stats = _loss(lp, lp.clone(), [2.0, -1.0], mask)
    # token-level: -(2*3 + (-1)*1) / 4 tokens; a per-sequence mean would be -(2 - 1)/2
    assert loss.item() == pytest.approx(-5 / 4)
    assert loss.item() != pytest.approx(-0.5)
    assert stats["clip_frac"] == 0.0
    assert stats["ratio_mean"] == pytest.approx(1.0)
    assert stats["approx_kl"] == pytest.approx(0.0, abs=1e-7)


def test_long_sequence_weighs_more_than_short():
    lp = torch.zeros(2, 10)
    long_short = [[1] * 10, [1] + [0] * 9]
    loss_pos_long, _ = _loss(lp, lp, [1.0, -1.0], long_short)
    # long positive (10 tokens) vs short negative (1 token): -(10 - 1)/11
    assert loss_pos_long.item() == pytest.approx(-9 / 11)
    loss_pos_short, _ = _loss(lp, lp, [-1.0, 1.0], long_short)
    assert loss_pos_short.item() == pytest.approx(9 / 11)


def test_loss_hand_computation_with_ratios():
    old = torch.zeros(1, 4)
    r = torch.tensor([[1.1, 1.5, 0.5, 0.9]])
    lp = torch.log(r)
    loss, stats = _loss(lp, old, [1.0], [[1, 1, 1, 0]])
    # A>0: per token max(-r, -clip(r, .8, 1.28)) = -min(r, clip(r))
    per = [-1.1, -1.28, -0.5]
    assert loss.item() == pytest.approx(sum(per) / 3, rel=1e-5)
    assert stats["clip_frac"] == pytest.approx(1 / 3)  # only the 1.5 token is clipped
    assert stats["ratio_mean"] == pytest.approx((1.1 + 1.5 + 0.5) / 3, rel=1e-5)


def _grad(ratio: float, adv: float, clip_low=0.2, clip_high=0.28) -> float:
    lp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    loss, _ = dapo_token_loss(lp, torch.zeros(1, 1), torch.tensor([adv]), torch.ones(1, 1),
                              clip_low=clip_low, clip_high=clip_high)
    loss.backward()
    return lp.grad.item()


def test_clip_higher_positive_advantage():
    # d(-A r)/d logp = -A r inside the trust region
    assert _grad(1.25, 1.0) == pytest.approx(-1.25, rel=1e-5)
    assert _grad(1.0, 2.0) == pytest.approx(-2.0, rel=1e-5)
    assert _grad(1.27, 1.0) == pytest.approx(-1.27, rel=1e-5)
    # beyond 1 + 0.28: clipped, no gradient
    assert _grad(1.29, 1.0) == 0.0
    assert _grad(1.5, 1.0) == 0.0
    # a symmetric 0.2 clip would already have stopped 1.25: the asymmetry is the point
    assert _grad(1.25, 1.0, clip_high=0.2) == 0.0
    # positive advantage, small ratio: the pessimistic bound keeps the gradient
    assert _grad(0.5, 1.0) == pytest.approx(-0.5, rel=1e-5)


def test_clip_lower_negative_advantage():
    assert _grad(0.85, -1.0) == pytest.approx(0.85, rel=1e-5)
    assert _grad(0.79, -1.0) == 0.0
    assert _grad(0.5, -1.0) == 0.0
    # negative advantage, large ratio: not clipped (no upper bound on the penalty)
    assert _grad(1.5, -1.0) == pytest.approx(1.5, rel=1e-5)


def test_masked_tokens_get_zero_gradient():
    torch.manual_seed(0)
    lp = (torch.randn(2, 5) * 0.1).requires_grad_()
    old = torch.randn(2, 5) * 0.1
    mask = torch.tensor([[1, 0, 1, 0, 0], [0, 1, 1, 1, 0]])
    loss, _ = dapo_token_loss(lp, old, torch.tensor([1.0, -0.5]), mask)
    loss.backward()
    assert torch.all(lp.grad[mask == 0] == 0)
    assert torch.all(lp.grad[mask == 1] != 0)


def test_masked_tokens_do_not_change_loss():
    torch.manual_seed(1)
    lp, old = torch.randn(2, 6) * 0.1, torch.randn(2, 6) * 0.1
    mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]])
    base, _ = dapo_token_loss(lp, old, torch.tensor([1.0, -1.0]), mask)
    lp2 = lp.clone()
    lp2[mask == 0] += 5.0  # garbage on observation / padding tokens
    other, stats = dapo_token_loss(lp2, old, torch.tensor([1.0, -1.0]), mask)
    assert other.item() == pytest.approx(base.item())


def test_n_tokens_normaliser_and_micro_batches():
    torch.manual_seed(2)
    lp, old = torch.randn(4, 6) * 0.3, torch.randn(4, 6) * 0.3
    adv = torch.tensor([1.0, -1.0, 0.5, 2.0])
    mask = torch.tensor([[1] * 6, [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]])
    full, _ = dapo_token_loss(lp, old, adv, mask)
    total = float(mask.sum())
    halves = sum(dapo_token_loss(lp[s], old[s], adv[s], mask[s], n_tokens=total)[0] for s in (slice(0, 2), slice(2, 4)))
    assert halves.item() == pytest.approx(full.item(), rel=1e-5)
    # without the global normaliser the micro-batch average is NOT the token mean
    naive = sum(dapo_token_loss(lp[s], old[s], adv[s], mask[s])[0] for s in (slice(0, 2), slice(2, 4))) / 2
    assert naive.item() != pytest.approx(full.item(), rel=1e-3)
    # explicit n_tokens divides the masked sum
    scaled, _ = dapo_token_loss(lp, old, adv, mask, n_tokens=2 * total)
    assert scaled.item() == pytest.approx(full.item() / 2, rel=1e-5)


def test_empty_mask_is_finite():
    lp = torch.zeros(1, 3)
    loss, stats = dapo_token_loss(lp, lp, torch.tensor([1.0]), torch.zeros(1, 3))
    assert loss.item() == 0.0 and stats["clip_frac"] == 0.0


def test_clip_frac_counts_only_masked_clipped_tokens():
    old = torch.zeros(2, 4)
    lp = torch.log(torch.tensor([[1.5, 1.0, 0.5, 1.5], [0.5, 1.0, 1.5, 0.7]]))
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    _, stats = dapo_token_loss(lp, old, torch.tensor([1.0, -1.0]), mask)
    # seq0 (A>0): 1.5 clipped, 1.0 not, 0.5 not (pessimistic keeps it), 4th masked
    # seq1 (A<0): 0.5 clipped, 1.0 not, 1.5 not, 0.7 clipped
    assert stats["clip_frac"] == pytest.approx(3 / 7)


def test_approx_kl_is_positive_off_policy():
    old = torch.zeros(1, 3)
    lp = torch.tensor([[0.2, -0.3, 0.1]])
    _, stats = dapo_token_loss(lp, old, torch.tensor([1.0]), torch.ones(1, 3))
    want = sum((math.exp(x) - 1 - x) for x in (0.2, -0.3, 0.1)) / 3
    assert stats["approx_kl"] == pytest.approx(want, rel=1e-5)


# ============================================================================ token_logprobs


@pytest.fixture(scope="module")
def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2)
    return LlamaForCausalLM(cfg).eval()


def test_token_logprobs_matches_manual(tiny_llama):
    torch.manual_seed(3)
    ids = torch.randint(0, 50, (2, 7))
    attn = torch.ones(2, 7, dtype=torch.long)
    attn[1, 5:] = 0  # right padding
    with torch.no_grad():
        got = token_logprobs(tiny_llama, ids, attn)
        logits = tiny_llama(input_ids=ids, attention_mask=attn).logits.float()
    assert got.shape == (2, 7)
    assert torch.all(got[:, 0] == 0)
    logp = torch.log_softmax(logits, dim=-1)
    for b in range(2):
        for t in range(1, 7):
            want = logp[b, t - 1, ids[b, t]]
            assert got[b, t].item() == pytest.approx(want.item(), abs=1e-5), (b, t)
    assert torch.all(got[:, 1:] < 0)


def test_token_logprobs_from_start_equals_full_pass(tiny_llama):
    """start=k runs the LM head on fewer positions; log-probs from k on must not change."""
    torch.manual_seed(4)
    ids = torch.randint(0, 50, (2, 9))
    attn = torch.ones(2, 9, dtype=torch.long)
    attn[0, 7:] = 0
    with torch.no_grad():
        full = token_logprobs(tiny_llama, ids, attn)
        for k in (1, 4, 8, 9):
            part = token_logprobs(tiny_llama, ids, attn, start=k)
            assert part.shape == full.shape
            assert torch.all(part[:, :k] == 0)
            torch.testing.assert_close(part[:, k:], full[:, k:], atol=1e-5, rtol=1e-5)


def test_token_logprobs_is_differentiable(tiny_llama):
    ids = torch.randint(0, 50, (1, 5))
    out = token_logprobs(tiny_llama, ids, torch.ones_like(ids))
    out.sum().backward()
    grads = [p.grad for p in tiny_llama.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
    tiny_llama.zero_grad(set_to_none=True)


def test_sequence_aggregation_weighs_every_sample_equally():
    # the ablation arm (GRPO's per-sample mean): long and short samples count the same
    lp = torch.zeros(2, 10)
    long_short = torch.tensor([[1] * 10, [1] + [0] * 9])
    loss, _ = dapo_token_loss(lp, lp, torch.tensor([1.0, -1.0]), long_short, aggregation="sequence")
    assert loss.item() == pytest.approx(0.0)  # (-1 + 1) / 2, where token-level gives -9/11
    # a micro-batch of a larger mini-batch: n_sequences is the normaliser
    part, _ = dapo_token_loss(lp[:1], lp[:1], torch.tensor([1.0]), long_short[:1], aggregation="sequence",
                                   n_sequences=2)
    assert part.item() == pytest.approx(-0.5)


def test_sequence_aggregation_gradient_per_token_shrinks_with_length():
    lp = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    loss, _ = dapo_token_loss(lp, lp.detach(), torch.tensor([1.0, 1.0]), mask, aggregation="sequence")
    loss.backward()
    assert lp.grad[0, 0].item() == pytest.approx(-1 / 8)  # 1/(2 samples * 4 tokens)
    assert lp.grad[1, 0].item() == pytest.approx(-1 / 2)  # 1/(2 samples * 1 token)


def test_unknown_aggregation_is_a_clear_error():
    with pytest.raises(ValueError, match="aggregation"):
        dapo_token_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2), aggregation="seq")


def test_high_ratio_frac_counts_tokens_only_clip_higher_keeps():
    old = torch.zeros(1, 3)
    lp = torch.log(torch.tensor([[1.1, 1.25, 1.5]]))
    _, pos = dapo_token_loss(lp, old, torch.tensor([1.0]), torch.ones(1, 3))
    assert pos["high_ratio_frac"] == pytest.approx(1 / 3)  # only 1.25 is in (1.2, 1.28]: 1.5 is cut by both clips
    _, neg = dapo_token_loss(lp, old, torch.tensor([-1.0]), torch.ones(1, 3))
    assert neg["high_ratio_frac"] == 0.0  # negative advantage: the upper clip never applies


def test_probability_gap_is_per_masked_token():
    from coa_lab.rl import dapo

    train = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    sampled = torch.log(torch.tensor([[0.5, 0.3, 0.1]]))
    gap = dapo.probability_gap(train, sampled, torch.tensor([[1, 1, 0]]))
    assert torch.allclose(gap, torch.tensor([0.0, 0.1]), atol=1e-6)  # the unmasked 0.8 gap is not counted


def test_token_logprobs_with_nothing_to_score_still_backpropagates(tiny_llama):
    """start == length (every response empty): zeros, but a loss built on them must not break backward."""
    ids = torch.randint(0, 50, (2, 5))
    out = token_logprobs(tiny_llama, ids, torch.ones_like(ids), start=5)
    assert out.shape == (2, 5) and torch.all(out == 0)
    out.sum().backward()
    tiny_llama.zero_grad(set_to_none=True)


# ============================================================================ truncated importance sampling


def test_tis_weights_are_the_capped_ratio_on_policy_tokens_and_1_elsewhere():
    # the trainer gives 0.40 where the sampler drew at 0.10 (ratio 4: capped at 2), 0.25 where it
    # drew at 0.50 (0.5), an observation token (mask 0; the sampler's log-prob there is 0.0), and a
    # token both agree on (1)
    train = torch.log(torch.tensor([[0.40, 0.25, 0.30, 0.90]])).requires_grad_()
    sampler = torch.log(torch.tensor([[0.10, 0.50, 1.00, 0.90]]))
    mask = torch.tensor([[1, 1, 0, 1]])
    weights, capped = tis_weights(train, sampler, mask, cap=2.0)
    assert weights.tolist()[0] == pytest.approx([2.0, 0.5, 1.0, 1.0], abs=1e-6)
    assert capped.tolist() == [[True, False, False, False]]
    assert not weights.requires_grad  # a weight, never a path for the gradient
    # the cap is a cap, not a scale: a ratio just under it passes unchanged
    weights, capped = tis_weights(torch.log(torch.tensor([[0.19]])), torch.log(torch.tensor([[0.10]])),
                                  torch.ones(1, 1), cap=2.0)
    assert float(weights) == pytest.approx(1.9) and not capped.any()


def test_high_ratio_frac_is_where_clip_higher_and_the_symmetric_clip_disagree():
    """The logged share equals the one measured from the two losses' own gradients (lesson 07's
    toy batch): the band is exactly (1 + clip_low, 1 + clip_high] with a positive advantage."""
    from coa_lab.lessons.exercises.lesson07 import TOY_ADVANTAGES, TOY_RATIOS, _clip_band

    lp = torch.log(torch.tensor(TOY_RATIOS))
    _, st = dapo_token_loss(lp, torch.zeros_like(lp), torch.tensor(TOY_ADVANTAGES), torch.ones_like(lp), 0.2, 0.28)
    assert st["high_ratio_frac"] == pytest.approx(_clip_band(clip_low=0.2, clip_high=0.28)) and st["high_ratio_frac"] > 0
