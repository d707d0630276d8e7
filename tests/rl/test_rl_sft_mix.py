"""The SFT loss mixed into RL (rl.sft_coef, InstructGPT's PPO-ptx): its gradient is exactly
coef x the masked SFT loss's, ranks' shares add up to the whole batch, the trainer logs it every
step, and its stream of SFT rows survives a resume."""

import json

import pytest
import torch
from conftest import tiny_sft_records as _records

from coa_lab.config import get_preset

TEXT = "<think>t</think><answer>\\boxed{2}</answer>"


def _grads(model) -> list[torch.Tensor]:
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
            for p in model.parameters() if p.requires_grad]


@pytest.mark.model
def test_sft_mix_gradient_is_coef_times_the_sft_loss_and_rank_shares_add_up():
    from coa_lab.generation.models import load_model
    from coa_lab.rl.update import _sft_mix
    from coa_lab.training.sft import encode_example, masked_lm_loss, pad_batch, record_messages

    preset = get_preset("cpu-smoke")
    model, tok = load_model(preset.model, trainable=True)
    model.eval()  # no dropout: the passes below must compute the same function
    rows = [encode_example(tok, record_messages(r), r.text) for r in _records(3)]
    model.zero_grad()
    reference = masked_lm_loss(model, pad_batch(rows, tok.pad_token_id))
    (0.5 * reference).backward()
    want = _grads(model)
    for packed in (False, True):
        model.zero_grad()
        loss = _sft_mix(model, rows, 0.5, tok.pad_token_id, packed, "cpu", _null, 1, 0)
        assert loss == pytest.approx(float(reference.detach()), rel=1e-4)
        for got, w in zip(_grads(model), want):
            assert torch.allclose(got, w, atol=1e-6, rtol=1e-3)
    # two ranks: rows 0, 2 and row 1; their gradients summed are the whole batch's
    model.zero_grad()
    first = _sft_mix(model, rows, 0.5, tok.pad_token_id, False, "cpu", _null, 2, 0)
    second = _sft_mix(model, rows, 0.5, tok.pad_token_id, False, "cpu", _null, 2, 1)
    assert first + second == pytest.approx(float(reference.detach()), rel=1e-4)
    for got, w in zip(_grads(model), want):
        assert torch.allclose(got, w, atol=1e-6, rtol=1e-3)
    assert any(float(w.abs().sum()) > 0 for w in want)  # the comparison had something to compare


def _null():
    import contextlib

    return contextlib.nullcontext()


@pytest.mark.model
def test_trainer_mixes_sft_rows_every_step_and_resumes_their_stream(tmp_path):
    from coa_lab.generation.result import Generation
    from coa_lab.rl.trainer import train_rl
    from coa_lab.tasks.records import Task
    from coa_lab.tools.registry import build_tools

    class Alternating:  # rollout i answers outputs[i % 2]: every group has one right, one wrong
        def __init__(self, tokenizer, outputs):
            self.tokenizer, self.outputs = tokenizer, outputs

        def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stop=()):
            ids = [self.tokenizer(self.outputs[i % 2], add_special_tokens=False)["input_ids"] for i in range(len(prompts))]
            return [Generation(x, self.tokenizer.decode(x), "stop", len(p)) for x, p in zip(ids, prompts)]

    task = Task("t1", "What is 1 + 1?", ["2"], "test", "math", {})
    rl = {"steps": 2, "prompts_per_step": 1, "group_size": 2, "max_sampling_rounds": 0, "sft_coef": 1.0,
          "sft_rows": 2, "mini_batches": 1}
    factory = lambda model, tok: Alternating(tok, [TEXT, TEXT.replace("{2}", "{5}")])  # noqa: E731
    records = _records(3)
    train_rl(get_preset("cpu-smoke", rl={**rl, "steps": 1}), [task], build_tools(["code"]), tmp_path,
             generator_factory=factory, sft_records=records)
    state = torch.load(tmp_path / "checkpoint" / "state.pt", weights_only=False)
    assert state["sft_mix"]["pos"] == 2  # one step drew sft_rows rows
    train_rl(get_preset("cpu-smoke", rl=rl), [task], build_tools(["code"]), tmp_path,
             generator_factory=factory, sft_records=records, resume=True)
    state = torch.load(tmp_path / "checkpoint" / "state.pt", weights_only=False)
    assert state["sft_mix"]["pos"] == 1  # 2 + 2 rows over a 3-row set: the second pass, 1 in
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["sft_loss"] > 0 for r in rows)
    with pytest.raises(ValueError, match="no SFT trajectories"):
        train_rl(get_preset("cpu-smoke", rl=rl), [task], build_tools(["code"]), tmp_path / "none",
                 generator_factory=factory)
    with pytest.raises(ValueError, match="sft_coef must be >= 0"):
        train_rl(get_preset("cpu-smoke", rl={**rl, "sft_coef": -1.0}), [task], build_tools(["code"]),
                 tmp_path / "neg", generator_factory=factory, sft_records=records)
    train_rl(get_preset("cpu-smoke", rl={**rl, "sft_coef": 0.0, "steps": 1}), [task], build_tools(["code"]),
             tmp_path / "off", generator_factory=factory)
    with pytest.raises(ValueError, match="without the SFT mix"):  # a run started without it
        train_rl(get_preset("cpu-smoke", rl=rl), [task], build_tools(["code"]), tmp_path / "off",
                 generator_factory=factory, sft_records=records, resume=True)
