"""Int8 rollouts (rl.rollout_int8) and the truncated importance sampling that corrects them."""

import copy
import math

import pytest
import torch

from coa_lab.student_rollout import run_coa
from coa_lab.config import get_preset
from coa_lab.generation.models import load_model
from coa_lab.rl import dapo
from coa_lab.rl.int8_rollouts import Int8Rollouts, int8_copy
from coa_lab.rl.update import policy_update
from coa_lab.tasks.records import Task
from coa_lab.tools.registry import build_tools

T = 0.7
TASK = Task("c1", "What is 17 + 25?", ["42"], "test", "math", {})


def test_token_weights_scale_each_tokens_loss_without_a_gradient_through_them():
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old, adv, mask = logp.detach().clone(), torch.tensor([1.0]), torch.ones(1, 3)
    weights = torch.tensor([[2.0, 0.0, 0.5]], requires_grad=True)
    loss, _ = dapo.dapo_token_loss(logp, old, adv, mask, token_weights=weights)
    loss.backward()
    # ratio 1: d(-A * ratio)/d logp = -A * w / n_tokens per token
    assert torch.allclose(logp.grad, torch.tensor([[-2.0, 0.0, -0.5]]) / 3)
    assert weights.grad is None
    plain, _ = dapo.dapo_token_loss(logp.detach(), old, adv, mask)
    assert float(loss.detach()) == pytest.approx(float(plain) * (2.0 + 0.0 + 0.5) / 3)


def test_int8_rollouts_need_a_cpu_model():
    class Gpu(torch.nn.Module):
        def parameters(self, recurse=True):
            yield torch.nn.Parameter(torch.zeros(1, device="meta"))

    with pytest.raises(ValueError, match="CPU path"):
        int8_copy(Gpu())


@pytest.mark.model
def test_int8_rollouts_are_corrected_and_their_gap_is_logged():
    preset = get_preset("cpu-smoke", model={"cpu_autocast_bf16": False},
                        rl={"temperature": T, "mini_batches": 2, "rollout_int8": True},
                        gen={"max_new_tokens": 24, "max_turns": 1, "max_response_tokens": 64})
    torch.manual_seed(0)
    model, tok = load_model(preset.model, trainable=True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    sampler = Int8Rollouts(model, tok, batch_size=8)
    torch.manual_seed(1)
    rollouts = run_coa(sampler, [TASK], build_tools(["code"]), preset.gen, samples=4, temperature=T)
    assert all(len(r.response_logprobs) == len(r.response_ids) > 0 for r in rollouts)
    quantized = sampler.model
    def int8(module):
        return [m for m in module.modules() if type(m).__module__.startswith("torch.ao.nn.quantized.dynamic")]

    assert len(int8(quantized)) == 30 * 7 + 1  # every projection of the 30 layers, and the LM head
    assert not int8(model)  # the policy stays fp32
    sampler.refresh()
    assert sampler.model is None  # rebuilt from the new weights at the next rollout

    groups, rewards = [rollouts[:2], rollouts[2:]], [[1.0, 0.0], [0.0, 1.0]]
    stats = {}
    for name, cap in (("tis", 2.0), ("none", None)):
        m = copy.deepcopy(model)
        opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4)
        p = get_preset("cpu-smoke", model={"cpu_autocast_bf16": False},
                       rl={"temperature": T, "mini_batches": 2, "rollout_int8": True, "tis_cap": cap})
        stats[name] = policy_update(m, opt, groups, rewards, p, tok.pad_token_id)
    # int8 sampling is a different policy: a gap far above exact rollouts' ~1e-7 (0.107 measured
    # here: fbgemm's per-tensor 7-bit activations are coarse for this 135M model; docs/design.md)
    assert stats["tis"]["logprob_gap"] > 1e-3
    assert 0.0 <= stats["tis"]["tis_capped_frac"] < 1.0
    assert 0.0 < stats["tis"]["tis_weight_mean"] <= 2.0
    assert "tis_capped_frac" not in stats["none"]  # tis_cap None: the uncorrected arm
    assert stats["tis"]["loss"] != pytest.approx(stats["none"]["loss"], abs=1e-9)
    assert math.isfinite(stats["tis"]["loss"])


@pytest.mark.model
def test_attention_only_int8_quantizes_the_four_projections_and_drifts_less():
    """rl.rollout_int8="attention": q/k/v/o in int8, the MLP and LM head as trained; its sampler's
    gap to the policy is smaller than the all-int8 copy's on the same tokens."""
    preset = get_preset("cpu-smoke", model={"cpu_autocast_bf16": False})
    model, tok = load_model(preset.model, trainable=True)

    def int8(module):
        return [n for n, m in module.named_modules() if type(m).__module__.startswith("torch.ao.nn.quantized.dynamic")]

    attention = int8(int8_copy(model, "attention"))
    assert len(attention) == 30 * 4 and all(n.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) for n in attention)
    assert len(int8(int8_copy(model, "all"))) == 30 * 7 + 1
    with pytest.raises(ValueError, match="'attention'"):
        int8_copy(model, "mlp")
    ids = tok("<think>What is 17 + 25? Add them: 17 + 25 = 42.</think><answer>42</answer>", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        exact = torch.log_softmax(model(ids).logits.float(), -1)
        gaps = {which: float((torch.log_softmax(int8_copy(model, which)(ids).logits.float(), -1).exp() - exact.exp())
                             .abs().sum(-1).mean() / 2) for which in ("attention", "all")}
    assert gaps["attention"] < gaps["all"]  # total variation per position


@pytest.mark.model
def test_a_bf16_policy_gets_an_fp32_int8_twin_that_runs():
    """A GPU preset's bf16 weights on a CPU (notebook 07 under gpu-smoke): the int8 kernels take
    fp32 activations, so the twin is fp32 around its int8 matmuls; the policy keeps its dtype."""
    preset = get_preset("cpu-smoke", model={"cpu_autocast_bf16": False, "dtype": "bfloat16"})
    model, tok = load_model(preset.model, trainable=True)
    assert next(model.parameters()).dtype == torch.bfloat16
    twin = int8_copy(model, "attention")
    ids = tok("<think>17 + 25 = 42.</think><answer>42</answer>", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = twin(ids).logits
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    assert next(model.parameters()).dtype == torch.bfloat16


def test_an_unknown_int8_choice_is_refused_before_anything_loads(tmp_path):
    from coa_lab.rl.trainer import train_rl

    preset = get_preset("cpu-smoke", rl={"rollout_int8": "mlp"})
    with pytest.raises(ValueError, match="rl.rollout_int8 must be"):
        train_rl(preset, [TASK], build_tools(["code"]), tmp_path)
