"""Choosing the next token (coa_lab/generation/sampling.py): greedy, top-p, and the draw itself."""

from __future__ import annotations

import torch

from coa_lab.generation import sampling
from coa_lab.generation.sampling import draw, sample, sample_rows


def test_top_p_sampling_never_picks_outside_the_nucleus():
    torch.manual_seed(0)
    logits = torch.tensor([[5.0, 4.0, 0.0, -1.0]] * 200)
    picks, logp, entropy = sample(logits, temperature=1.0, top_p=0.8)
    assert set(picks.tolist()) <= {0, 1}
    # the recorded log-prob is the renormalised nucleus distribution's: what was really sampled
    nucleus = torch.softmax(torch.tensor([5.0, 4.0]), -1)
    assert torch.allclose(logp.exp(), nucleus[picks], atol=1e-6)
    assert torch.allclose(entropy, -(nucleus * nucleus.log()).sum().expand(200), atol=1e-6)
    assert sample(logits[:1], temperature=0.0, top_p=1.0)[0].tolist() == [0]


def test_greedy_takes_the_first_maximum_as_argmax_does():
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [3.0, 3.0, 3.0, 3.0]]).to(torch.bfloat16)
    token, logp, entropy = sample(logits, 0.0, 1.0)
    assert token.tolist() == logits.float().argmax(-1).tolist() == [1, 0] and logp is None


def test_draw_follows_the_distribution():
    torch.manual_seed(0)
    probs = torch.tensor([0.5, 0.0, 0.3, 0.15, 0.05, 0.0])
    picks = draw(probs.expand(40_000, -1).contiguous())
    freq = torch.bincount(picks, minlength=6).float() / 40_000
    # binomial standard error at p = 0.5 over 40k draws is 0.0025: 4 of them
    assert torch.allclose(freq, probs, atol=0.01)
    assert freq[1] == 0 and freq[5] == 0  # zero-probability tokens are never drawn


def test_draw_never_returns_a_zero_probability_token_at_the_rounding_edge(monkeypatch):
    # u rounded up to the total mass would land past the last token of positive probability
    probs = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    monkeypatch.setattr(sampling.torch, "rand", lambda shape, **kw: torch.ones(shape, dtype=kw.get("dtype")))
    assert draw(probs).tolist() == [1, 2]


def test_rows_at_their_own_temperatures():
    torch.manual_seed(0)
    logits = torch.tensor([[0.0, 3.0, 1.0]] * 4)
    token, logp, entropy = sample_rows(logits, [0.0, 1.0, 0.0, 1.0], 1.0)
    assert token[0] == token[2] == 1 and logp[0] == logp[2] == entropy[0] == 0
    expected = torch.log_softmax(logits[1], -1)
    assert torch.allclose(logp[[1, 3]], expected[token[[1, 3]]])
    assert sample_rows(logits, [0.0] * 4, 1.0)[1] is None
