"""The KL term to the SFT policy (rl.kl_coef): the k3 estimate, the reference weights swapped in
for one pass, and the reference surviving a resume."""

import json

import pytest
import torch

from coa_lab.config import get_preset
from coa_lab.rl import dapo
from coa_lab.rl.reference import ReferenceWeights


def test_k3_is_zero_where_policy_and_reference_agree_and_positive_elsewhere():
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    assert torch.allclose(dapo.kl_to_reference(logp, logp), torch.zeros(1, 3))
    ref = torch.log(torch.tensor([[0.4, 0.6, 0.9]]))
    kl = dapo.kl_to_reference(logp, ref)
    assert (kl[0, :2] > 0).all() and kl[0, 2] == 0


def test_k3_gradient_pulls_the_policy_towards_the_reference():
    logp = torch.log(torch.tensor([[0.2, 0.8]])).requires_grad_()
    ref = torch.log(torch.tensor([[0.5, 0.5]]))
    dapo.kl_to_reference(logp, ref).sum().backward()
    # descending the loss raises the token the reference likes more, lowers the other
    assert logp.grad[0, 0] < 0 and logp.grad[0, 1] > 0


def test_kl_term_is_averaged_like_the_policy_loss():
    logp = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.3, 0.3]]))
    ref = torch.log(torch.tensor([[0.4, 0.6, 0.9], [0.3, 0.1, 0.3]]))
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([1.0, -1.0])
    base, _ = dapo.dapo_token_loss(logp, logp, adv, mask)
    with_kl, st = dapo.dapo_token_loss(logp, logp, adv, mask, ref_logprobs=ref, kl_coef=0.1)
    kl = dapo.kl_to_reference(logp, ref)
    expected = (kl * mask).sum() / mask.sum()
    assert torch.allclose(with_kl - base, 0.1 * expected)
    assert st["kl_ref"] == pytest.approx(float(expected))
    off, st_off = dapo.dapo_token_loss(logp, logp, adv, mask, ref_logprobs=ref, kl_coef=0.0)
    assert torch.allclose(off, base) and "kl_ref" in st_off  # measured even when it does not act


def test_reference_weights_are_swapped_in_and_back():
    lin = torch.nn.Linear(2, 2)
    lin.bias.requires_grad_(False)
    ref = ReferenceWeights(lin)
    start = lin.weight.detach().clone()
    with torch.no_grad():
        lin.weight.add_(1.0)
    moved = lin.weight.detach().clone()
    with ref.active():
        assert torch.equal(lin.weight, start)
    assert torch.equal(lin.weight, moved)
    again = ReferenceWeights(lin, ref.state())  # a resumed run: the saved copy, not the current weights
    with again.active():
        assert torch.equal(lin.weight, start)
    with pytest.raises(ValueError, match="lack"):
        ReferenceWeights(lin, {})


@pytest.mark.model
def test_kl_to_sft_is_zero_at_the_first_update_then_grows_and_survives_resume(tmp_path):
    from coa_lab.generation.result import Generation
    from coa_lab.rl.trainer import train_rl
    from coa_lab.tasks.records import Task
    from coa_lab.tools.registry import build_tools

    class Alternating:  # rollout i answers outputs[i % 2]: a group with one right and one wrong
        def __init__(self, tokenizer, outputs):
            self.tokenizer, self.outputs = tokenizer, outputs

        def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stop=()):
            ids = [self.tokenizer(self.outputs[i % 2], add_special_tokens=False)["input_ids"] for i in range(len(prompts))]
            return [Generation(x, self.tokenizer.decode(x), "stop", len(p)) for x, p in zip(ids, prompts)]

    TASKS = [Task("t1", "What is 1 + 1?", ["2"], "test", "math", {})]
    rl = {"steps": 2, "prompts_per_step": 1, "group_size": 2, "max_sampling_rounds": 0, "kl_coef": 0.5,
          "learning_rate": 1e-2}
    factory = lambda model, tok: Alternating(tok, ["<think>t</think><answer>\\boxed{2}</answer>", "<think>t</think><answer>\\boxed{5}</answer>"])  # noqa: E731
    preset = get_preset("cpu-smoke", rl={**rl, "steps": 1})
    train_rl(preset, [TASKS[0]], build_tools(["code"]), tmp_path, generator_factory=factory)
    state = torch.load(tmp_path / "checkpoint" / "state.pt", weights_only=False)
    assert state["reference"]  # the SFT weights travel with the checkpoint
    result = train_rl(get_preset("cpu-smoke", rl=rl), [TASKS[0]], build_tools(["code"]), tmp_path,
                      generator_factory=factory, resume=True)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 == len(result.metrics)
    assert rows[0]["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # the policy IS the reference before any step
    assert rows[1]["kl_ref"] > 1e-4  # after a step at lr 1e-2 it has moved, measured against the saved SFT copy
    with pytest.raises(ValueError, match="kl_coef must be >= 0"):
        train_rl(get_preset("cpu-smoke", rl={**rl, "kl_coef": -1.0}), [TASKS[0]], build_tools(["code"]),
                 tmp_path / "neg", generator_factory=factory)
