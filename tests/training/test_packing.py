"""coa_lab/training/packing.py: a packed row must give every sequence exactly the log-probs (and the
gradients) of its own padded forward, for every attention implementation it accepts."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coa_lab.training import packing
from coa_lab.training.logprobs import token_logprobs


def _tiny(attn: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    from coa_lab.generation.cpu_attention import use_native_gqa

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=60, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, attn_implementation="sdpa" if attn != "eager" else "eager")
    model = LlamaForCausalLM(cfg)
    if attn == "gqa":
        assert use_native_gqa(model)
    return model


def _padded(model, seqs, starts):
    width = max(len(s) for s in seqs)
    ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
    attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    out = token_logprobs(model, ids, attn, min(starts))
    keep = torch.zeros_like(out)
    for i, (s, st_) in enumerate(zip(seqs, starts)):
        keep[i, st_ : len(s)] = 1
    return out * keep


PROMPT = [5, 9, 11, 3, 7, 22, 8]
GROUP = [PROMPT + [4, 4, 17, 30], PROMPT + [4, 12], PROMPT + [19, 2, 2, 2, 40, 41], PROMPT[:5] + [50, 51]]


@pytest.mark.parametrize("attn", ["sdpa", "gqa", "eager"])
def test_packed_logprobs_and_gradients_equal_padded(attn):
    model = _tiny(attn)
    starts = [len(PROMPT)] * 3 + [5]
    want = _padded(model, GROUP, starts)
    want.sum().backward()
    want_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    got = packing.sequence_logprobs(model, GROUP, [[0, 1, 2], [3]], starts, pad_id=0)
    got.sum().backward()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for g, w in zip([p.grad for p in model.parameters()], want_grads):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_shared_prefix_is_laid_out_once():
    packed = packing.pack([GROUP], pad_id=0)
    # the prompt once, then each sample's own tokens: the second shares the prompt and its
    # first answer token with the first, the fourth 5 prompt tokens
    assert packed.tokens == len(PROMPT) + 4 + 1 + 6 + 2
    assert packed.index[1][: len(PROMPT) + 1].tolist() == list(range(len(PROMPT) + 1))
    q = int(packed.index[2][len(PROMPT)])  # the third sample's first own token ...
    assert q == len(PROMPT) + 4 + 1
    assert packed.position_ids[0, q].item() == len(PROMPT)  # ... counts on from the prompt
    # ... and sees the prompt and itself, not the other samples' tokens
    assert packed.allowed[0, q].nonzero().flatten().tolist() == list(range(len(PROMPT))) + [q]


def test_cpu_attention_runs_block_by_block(monkeypatch):
    """On the lab's CPU attention the packed forward never computes the row's full mask."""
    from coa_lab.generation import cpu_attention

    calls = []
    real = cpu_attention.segment_attention
    monkeypatch.setattr(cpu_attention, "segment_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = _tiny("gqa")
    with torch.no_grad():
        packing.sequence_logprobs(model, GROUP, [[0, 1, 2, 3]], [1] * 4, pad_id=0)
    assert len(calls) == model.config.num_hidden_layers
    segs = packing.segments(packing.pack([GROUP], 0).index, [0] * 4, 1)[0]
    # own blocks cover the row in order; the second sample's block is its one own token
    assert [(a, b) for a, b, _, _ in segs] == [(0, 11), (11, 12), (12, 18), (18, 20)]
    assert segs[1][2].tolist() == list(range(8)) + [11] and segs[1][3].tolist() == [[True] * 9]


def test_rows_are_padded_without_nan():
    model = _tiny("sdpa")
    with torch.no_grad():
        out = packing.sequence_logprobs(model, GROUP, [[0], [1, 2, 3]], [1, 1, 1, 1], pad_id=0)
    assert torch.isfinite(out).all()


def test_flash_attention_is_not_supported():
    model = _tiny("sdpa")
    assert packing.supported(model)
    model.config._attn_implementation = "flash_attention_2"
    assert not packing.supported(model)
    with pytest.raises(ValueError, match="4D mask"):
        packing.pack([GROUP], 0).model_inputs(model)


def test_empty_input_is_a_clear_error():
    with pytest.raises(ValueError):
        packing.pack([[]], 0)
    with pytest.raises(ValueError):
        packing.pack([[[1], []]], 0)


_MODEL = _tiny("gqa")  # the CPU path: block-by-block segment attention


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(1, 8), min_size=2, max_size=9), min_size=1, max_size=5),
       st.integers(0, 2))
def test_any_sequences_pack_to_their_padded_logprobs(seqs, n_rows):
    """Small alphabet: random sequences share prefixes of every length, identical ones included."""
    rows = [list(range(len(seqs)))] if n_rows == 0 else [[i for i in range(len(seqs)) if i % 2 == r]
                                                          for r in range(2) if any(i % 2 == r for i in range(len(seqs)))]
    starts = [1] * len(seqs)
    with torch.no_grad():
        want = _padded(_MODEL, seqs, starts)
        got = packing.sequence_logprobs(_MODEL, seqs, rows, starts, pad_id=0)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
