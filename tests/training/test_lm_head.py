"""coa_lab/training/lm_head.py: log-probs and losses a chunk of positions at a time must equal the plain
full-logits computation (values and gradients), and never project more than a chunk at once."""

from __future__ import annotations

import pytest
import torch

from coa_lab.training.lm_head import CHUNK, chunked_nll, nll_at


def _model(tie: bool = False, softcap: float | None = None):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=tie)
    model = LlamaForCausalLM(cfg)
    if softcap is not None:
        model.config.final_logit_softcapping = softcap
    return model


def _plain_nll(model, ids, attn, rows, columns, targets, temperature, softcap=None):
    """The computation the chunked path replaces: every position's [V] logits at once."""
    logits = model(input_ids=ids, attention_mask=attn).logits.float()  # [R, L, V]
    picked = logits[rows, columns]
    if softcap:
        picked = torch.tanh(picked / softcap) * softcap
    return torch.nn.functional.cross_entropy(picked / temperature, targets, reduction="none", ignore_index=-100)


def _case(model, n_rows=3, length=13):
    torch.manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (n_rows, length))
    attn = torch.ones_like(ids)
    attn[2, 10:] = 0
    rows = torch.tensor([0, 0, 1, 2, 2, 2, 1, 0])
    columns = torch.tensor([3, 11, 0, 9, 4, 5, 11, 7])
    targets = ids[rows, columns + 1]
    targets[4] = -100  # an ignored label scores 0
    return ids, attn, rows, columns, targets


@pytest.mark.parametrize("tie,softcap,chunk", [(False, None, 3), (True, None, 1), (False, 30.0, 5), (False, None, CHUNK)])
def test_chunked_nll_equals_the_full_logits_values_and_gradients(tie, softcap, chunk):
    model = _model(tie, softcap)
    ids, attn, rows, columns, targets = _case(model)
    want = _plain_nll(model, ids, attn, rows, columns, targets, 0.8, softcap)
    want.sum().backward()
    want_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    got = nll_at(model, {"input_ids": ids, "attention_mask": attn}, rows, columns, targets, 0.8, chunk=chunk)
    got.sum().backward()
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert got[4] == 0 and (got[[0, 1, 2, 3, 5, 6, 7]] > 0).all()
    assert set(want_grads) == {n for n, p in model.named_parameters() if p.grad is not None}
    for name, grad in want_grads.items():  # the head's weight (tied to the embeddings or not) included
        torch.testing.assert_close(model.get_parameter(name).grad, grad, atol=1e-6, rtol=1e-4, msg=name)


def test_the_head_never_projects_more_than_a_chunk_and_recomputes_in_the_backward():
    model = _model()
    ids, attn, rows, columns, targets = _case(model)
    widths = []
    hook = model.get_output_embeddings().register_forward_hook(lambda m, a, out: widths.append(out.shape[-2]))
    try:
        nll_at(model, {"input_ids": ids, "attention_mask": attn}, rows, columns, targets, chunk=3).sum().backward()
    finally:
        hook.remove()
    # the model's own call projects 0 positions; 8 targets in chunks of 3 (3, 3, 2), each
    # projected once in the forward and once more in the backward (checkpointing)
    assert widths[0] == 0 and sorted(widths[1:]) == [2, 2, 3, 3, 3, 3]
    widths.clear()
    hook = model.get_output_embeddings().register_forward_hook(lambda m, a, out: widths.append(out.shape[-2]))
    try:
        with torch.no_grad():  # no backward to come: no recomputation
            nll_at(model, {"input_ids": ids, "attention_mask": attn}, rows, columns, targets, chunk=3)
    finally:
        hook.remove()
    assert widths == [0, 3, 3, 2]


def test_an_empty_selection_is_a_zero_loss_that_still_backpropagates():
    model = _model()
    ids, attn, *_ = _case(model)
    empty = torch.zeros(0, dtype=torch.long)
    got = nll_at(model, {"input_ids": ids, "attention_mask": attn}, empty, empty, empty)
    assert got.shape == (0,)
    got.sum().backward()  # an SFT batch without labels must not break the Trainer's backward


def test_chunked_nll_on_hidden_states_matches_cross_entropy():
    torch.manual_seed(2)
    head = torch.nn.Linear(8, 11, bias=True)
    hidden, targets = torch.randn(10, 8), torch.randint(0, 11, (10,))

    class Holder(torch.nn.Module):
        config = None

    got = chunked_nll(Holder(), head, hidden, targets, temperature=1.3, chunk=4)
    want = torch.nn.functional.cross_entropy(head(hidden) / 1.3, targets, reduction="none")
    torch.testing.assert_close(got, want)


def test_a_wrapped_model_is_unwrapped_for_its_head_and_a_sharded_head_takes_the_plain_path(monkeypatch):
    """Under DDP the wrapper runs the forward and the inner model owns the head; a ZeRO-3 / FSDP
    head (its weights whole only inside the engine's forward) falls back to the unchunked path."""
    from coa_lab.training import lm_head

    model = _model()
    ids, attn, rows, columns, targets = _case(model)
    want = nll_at(model, {"input_ids": ids, "attention_mask": attn}, rows, columns, targets, 0.8, chunk=3)

    class Wrapper(torch.nn.Module):  # what DistributedDataParallel looks like from outside
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, **kw):
            return self.module(**kw)

    got = nll_at(Wrapper(model), {"input_ids": ids, "attention_mask": attn}, rows, columns, targets, 0.8, chunk=3)
    torch.testing.assert_close(got, want)
    model.get_output_embeddings().weight.ds_id = 7  # what a ZeRO-3 parameter carries
    widths = []
    hook = model.get_output_embeddings().register_forward_hook(lambda m, a, out: widths.append(out.shape[-2]))
    try:
        plain = nll_at(model, {"input_ids": ids, "attention_mask": attn}, rows, columns, targets, 0.8, chunk=3)
    finally:
        hook.remove()
        del model.get_output_embeddings().weight.ds_id
    assert widths == [len(torch.unique(columns))]  # one projection of every needed column: the plain path
    torch.testing.assert_close(plain, want, atol=1e-6, rtol=1e-5)
    assert lm_head._sharded(torch.nn.Linear(2, 2)) is False


# --- the fused linear-cross-entropy kernel where one is installed (liger-kernel >= 0.8.2, GPU) ---
# Liger's kernel needs Triton and a GPU; here a reference with its exact contract stands in for it
# (loss_i = CE(softcap(x_i W^T + b), t_i), 0 at ignore_index, reduction="none"), so what is tested
# is the lab's side: when the kernel is chosen, how the temperature reaches it, and that values
# and gradients equal the chunked path's.

def _reference_kernel(calls):
    def kernel(x, weight, target, bias=None, ignore_index=-100, reduction="mean", softcap=None, **_):
        assert reduction == "none"
        calls.append(x.shape[0])
        logits = (x @ weight.T + (0 if bias is None else bias)).float()
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        return torch.nn.functional.cross_entropy(logits, target, reduction="none", ignore_index=ignore_index)
    return kernel


@pytest.fixture
def fused_on_cpu(monkeypatch):
    from coa_lab.training import lm_head

    calls: list[int] = []
    monkeypatch.setattr(lm_head, "FUSED_DEVICES", ("cpu",))
    monkeypatch.setattr(lm_head, "_liger_kernel", lambda: _reference_kernel(calls))
    return calls


@pytest.mark.parametrize("temperature,softcap,bias", [(0.7, None, False), (1.0, 30.0, False), (0.8, None, True)])
def test_fused_kernel_path_equals_the_chunked_path(fused_on_cpu, monkeypatch, temperature, softcap, bias):
    model = _model(False, softcap)
    if bias:  # a head with a bias: the temperature must divide it too
        head = model.get_output_embeddings()
        head.bias = torch.nn.Parameter(torch.randn(head.out_features) * 0.5)
    ids, attn, rows, columns, targets = _case(model)
    inputs = {"input_ids": ids, "attention_mask": attn}
    weights = torch.linspace(-1.0, 2.0, len(targets))  # per-token upstream gradients, as DAPO's are
    from coa_lab.training import lm_head

    before = lm_head.FUSED_POSITIONS
    got = nll_at(model, inputs, rows, columns, targets, temperature)
    (got * weights).sum().backward()
    assert fused_on_cpu, "the fused kernel was not used"
    assert lm_head.FUSED_POSITIONS - before == len(targets)  # what gpu_validate.py records per figure
    got_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    monkeypatch.setenv("COA_LAB_FUSED_CE", "0")  # the switch: the chunked path
    n_calls, positions = len(fused_on_cpu), lm_head.FUSED_POSITIONS
    want = nll_at(model, inputs, rows, columns, targets, temperature)
    (want * weights).sum().backward()
    assert len(fused_on_cpu) == n_calls, "COA_LAB_FUSED_CE=0 still used the fused kernel"
    assert lm_head.FUSED_POSITIONS == positions
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert got[4] == 0
    for name, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(got_grads[name], p.grad, atol=1e-6, rtol=1e-4, msg=name)


def test_fused_kernel_is_skipped_where_it_would_compute_something_else(fused_on_cpu):
    from peft import LoraConfig, get_peft_model

    # softcap applied before the temperature: the kernel caps after our division, so chunked
    model = _model(False, 30.0)
    ids, attn, rows, columns, targets = _case(model)
    nll_at(model, {"input_ids": ids, "attention_mask": attn}, rows, columns, targets, 0.8)
    assert not fused_on_cpu
    # a LoRA-wrapped head computes W x + B A x: the kernel only sees W
    peft = get_peft_model(_model(), LoraConfig(r=2, target_modules=["lm_head"]))
    nll_at(peft, {"input_ids": ids, "attention_mask": attn}, rows, columns, targets, 0.8)
    assert not fused_on_cpu


def test_liger_kernel_older_than_the_gradient_fix_is_not_used(monkeypatch):
    import sys
    import types
    from importlib import metadata

    from coa_lab.training import lm_head

    functional = types.ModuleType("liger_kernel.transformers.functional")
    functional.liger_fused_linear_cross_entropy = _reference_kernel([])
    for name in ("liger_kernel", "liger_kernel.transformers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.functional", functional)
    for version, usable in (("0.8.1", False), ("0.5.2", False), ("0.8.2", True), ("0.8.5", True), ("1.0.0rc1", True)):
        monkeypatch.setattr(metadata, "version", lambda name, v=version: v)
        lm_head._liger_kernel.cache_clear()
        assert (lm_head._liger_kernel() is functional.liger_fused_linear_cross_entropy) is usable, version
    lm_head._liger_kernel.cache_clear()
