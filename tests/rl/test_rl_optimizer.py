"""Issue 57, step 2: an optimizer the policy gradient can use. The advantage modes (GRPO's,
Dr. GRPO's, RFT's), the learning-rate warm-up and schedule (per optimizer step, saved with the
checkpoint), and the step-size measures logged every step. With no warm-up, a constant schedule and
GRPO's advantage the update is bit-identical to the lab's before these switches."""

import json
import math
import random

import pytest
import torch
from conftest import tiny_sft_records as _records

from coa_lab.config import get_preset
from coa_lab.rl import dapo, optim

RIGHT, WRONG = "<think>t</think><answer>\\boxed{2}</answer>", "<think>t</think><answer>\\boxed{5}</answer>"


# ---- advantages: pure functions on toy tensors ----

def test_grpo_is_group_advantages_and_the_default_is_the_recipes_dr_grpo():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.2, 1.0, 0.7, 0.0]])
    assert torch.equal(dapo.advantages(r, "grpo"), dapo.group_advantages(r))
    assert dapo.advantages(r, "grpo")[0, 0] == pytest.approx(math.sqrt(3), rel=1e-4)  # the lone success: +1.73
    assert get_preset("cpu-tiny").rl.advantage == "dr_grpo"  # the arms' choice (docs/rl-effect.md)
    # a call without a mode computes what the config's default (the recipe) does
    assert torch.equal(dapo.advantages(r), dapo.advantages(r, get_preset("cpu-tiny").rl.advantage))
    assert torch.equal(dapo.advantages(r), dapo.advantages(r, "dr_grpo"))


def test_dr_grpo_is_reward_minus_group_mean_without_std():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0], [0.5, 0.5, 0.5, 0.5]])
    adv = dapo.advantages(r, "dr_grpo")
    assert torch.allclose(adv, r - r.mean(dim=1, keepdim=True))
    assert adv[0, 0] == pytest.approx(0.75) and adv[1, 3] == pytest.approx(-0.75)  # no difficulty bias
    assert torch.equal(adv[2], torch.zeros(4))


def test_rft_is_one_for_a_correct_rollout_zero_for_a_wrong_one_before_shaping():
    shaped = torch.tensor([[0.6, 0.0, 1.0, -0.3]])  # a correct but long answer was shaped to 0.6
    accuracy = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    assert torch.equal(dapo.advantages(shaped, "rft", accuracy), torch.tensor([[1.0, 0.0, 1.0, 0.0]]))
    assert torch.equal(dapo.advantages(accuracy, "rft"), accuracy)  # default: the rewards are the accuracy
    with pytest.raises(ValueError, match="rl.advantage"):
        dapo.advantages(shaped, "ppo")


def test_dynamic_sampling_under_rft_keeps_all_correct_groups_and_drops_all_wrong_ones():
    acc = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    assert dapo.informative_groups(acc).tolist() == [False, False, True]
    assert dapo.informative_groups(acc, "rft").tolist() == [True, False, True]


# ---- the schedule, per optimizer step ----

def _rates(rl, n: int) -> list[float]:
    p = torch.nn.Parameter(torch.zeros(2))
    opt, sched = optim.build_optimizer([p], rl)
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])  # the rate this optimizer step uses
        p.grad = torch.ones(2)
        opt.step()
        sched.step()
    return out


def test_default_schedule_warms_up_then_holds_the_rate_exactly():
    rl = get_preset("cpu-tiny").rl
    assert (rl.warmup_steps, rl.lr_schedule) == (2, "constant")
    rates = _rates(rl, 5)
    assert rates[0] < rates[1] < rl.learning_rate
    assert rates[2:] == [rl.learning_rate] * 3  # multiplied by exactly 1.0 after the warm-up


@pytest.mark.parametrize("schedule", ["constant", "cosine", "linear"])
def test_warmup_then_schedule_per_optimizer_step(schedule):
    rl = get_preset("cpu-smoke", rl={"steps": 3, "mini_batches": 2, "warmup_steps": 2, "lr_schedule": schedule,
                                     "learning_rate": 1e-3}).rl
    assert optim.total_optimizer_steps(rl) == 6
    after = {"constant": lambda k: 1.0, "cosine": lambda k: 0.5 * (1 + math.cos(math.pi * (k - 2) / 4)),
             "linear": lambda k: (6 - k) / 4}[schedule]
    want = [1e-3 * (k / 2 if k < 2 else after(k)) for k in range(6)]
    assert _rates(rl, 6) == pytest.approx(want, abs=1e-12)


def _take_steps(opt, sched, p, n: int) -> None:
    """n optimizer steps on a gradient of ones, the schedule stepped after each."""
    for _ in range(n):
        p.grad = torch.ones_like(p)
        opt.step()
        sched.step()


def test_lr_scales_sum_the_rates_taken():
    rl = get_preset("cpu-smoke", rl={"steps": 4, "mini_batches": 1, "learning_rate": 0.1}).rl
    p = torch.nn.Parameter(torch.zeros(1))
    opt, sched = optim.build_optimizer([p], rl)
    _take_steps(opt, sched, p, 4)
    scales = optim.lr_scales(sched)
    assert scales["lr_x_n"] == pytest.approx(0.4) and scales["lr_x_sqrt_n"] == pytest.approx(0.2)  # lr N, lr sqrt(N)


def test_bad_schedule_settings_are_refused():
    with pytest.raises(ValueError, match="rl.lr_schedule"):
        optim.check_schedule(get_preset("cpu-smoke", rl={"lr_schedule": "step"}).rl)
    with pytest.raises(ValueError, match="rl.warmup_steps"):
        optim.check_schedule(get_preset("cpu-smoke", rl={"warmup_steps": -1}).rl)


def test_a_restored_schedule_continues_exactly():
    rl = get_preset("cpu-smoke", rl={"steps": 5, "mini_batches": 2, "warmup_steps": 3, "lr_schedule": "cosine"}).rl
    whole = _rates(rl, 10)
    p = torch.nn.Parameter(torch.zeros(2))
    opt, sched = optim.build_optimizer([p], rl)
    _take_steps(opt, sched, p, 4)
    saved = {"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}
    p2 = torch.nn.Parameter(p.detach().clone())
    opt2, sched2 = optim.build_optimizer([p2], rl)  # a fresh process: the schedule starts at 0 ...
    opt2.load_state_dict(saved["optimizer"])
    optim.restore_schedule(sched2, saved, rl)  # ... until the checkpoint puts it back
    rest = []
    for _ in range(6):
        rest.append(opt2.param_groups[0]["lr"])
        p2.grad = torch.ones(2)
        opt2.step()
        sched2.step()
    assert rest == whole[4:]
    with pytest.raises(ValueError, match="without a learning-rate schedule"):
        optim.restore_schedule(sched2, {"optimizer": saved["optimizer"]}, rl)


# ---- with a model ----

class Alternating:
    """Rollout i answers outputs[i % len(outputs)]: a policy with a known success rate."""

    def __init__(self, tokenizer, outputs):
        self.tokenizer, self.outputs = tokenizer, outputs

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stop=()):
        from coa_lab.generation.result import Generation

        ids = [self.tokenizer(self.outputs[i % len(self.outputs)], add_special_tokens=False)["input_ids"]
               for i in range(len(prompts))]
        return [Generation(x, self.tokenizer.decode(x), "stop", len(p)) for x, p in zip(ids, prompts)]


def _task(i: int = 1):
    from coa_lab.tasks.records import Task

    return Task(f"t{i}", f"What is {i} + {i}?", [str(2 * i)], "test", "math", {})


def _group(tok, preset, outputs=(RIGHT, WRONG)):
    from coa_lab.student_rollout import run_coa
    from coa_lab.tools.registry import build_tools

    return run_coa(Alternating(tok, list(outputs)), [_task()], build_tools(["code"]), preset.gen, samples=2)


def _trainable(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters() if p.requires_grad]


def _fresh(preset):
    from coa_lab.generation.models import load_model

    torch.manual_seed(0)
    return load_model(preset.model, trainable=True)


@pytest.mark.model
def test_default_update_with_its_scheduler_is_bit_identical_to_a_plain_adamw_update():
    """The trainer before issue 57 stepped AdamW with no scheduler and GRPO's advantage; a constant
    schedule with no warm-up and the advantage selector set to grpo must not move the weights a bit."""
    from coa_lab.rl.update import policy_update

    preset = get_preset("cpu-smoke", rl={"mini_batches": 2, "warmup_steps": 0, "advantage": "grpo"})
    results = []
    for with_scheduler in (False, True):
        model, tok = _fresh(preset)
        groups = [_group(tok, preset), _group(tok, preset, (WRONG, RIGHT))]
        params = [p for p in model.parameters() if p.requires_grad]
        if with_scheduler:
            opt, sched = optim.build_optimizer(params, preset.rl)
        else:
            opt, sched = torch.optim.AdamW(params, lr=preset.rl.learning_rate, weight_decay=0.0), None
        random.seed(0)
        stats = policy_update(model, opt, groups, [[1.0, 0.0], [0.0, 1.0]], preset, tok.pad_token_id, scheduler=sched)
        results.append((stats, _trainable(model)))
    (plain, w_plain), (sched_stats, w_sched) = results
    assert all(torch.equal(a, b) for a, b in zip(w_plain, w_sched))
    assert plain["loss"] == sched_stats["loss"] and plain["grad_norm_pg"] == sched_stats["grad_norm_pg"]


def _sequence_logprob(model, rollout, temperature) -> float:
    from coa_lab.training.logprobs import token_logprobs

    ids = torch.tensor([rollout.prompt_ids + rollout.response_ids])
    mask = torch.tensor([[0] * len(rollout.prompt_ids) + rollout.response_mask], dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        lp = token_logprobs(model, ids, torch.ones_like(ids), len(rollout.prompt_ids), temperature=temperature)
    return float((lp * mask).sum())


@pytest.mark.model
def test_rft_update_raises_the_correct_rollouts_logprob_and_wrong_ones_push_nothing():
    from coa_lab.rl.update import policy_update

    preset = get_preset("cpu-smoke", rl={"advantage": "rft", "mini_batches": 1})
    model, tok = _fresh(preset)
    group = _group(tok, preset)
    params = [p for p in model.parameters() if p.requires_grad]
    # all wrong: every advantage is 0, so not one weight moves (SGD: no Adam epsilon games)
    before = _trainable(model)
    policy_update(model, torch.optim.SGD(params, lr=0.5), [group], [[0.0, 0.0]], preset, tok.pad_token_id)
    assert all(torch.equal(a, b) for a, b in zip(before, _trainable(model)))
    # one right (shaped to 0.6 by a length penalty, accuracy 1): advantage 1 on it, 0 on the wrong one
    right_before = _sequence_logprob(model, group[0], preset.rl.temperature)
    policy_update(model, torch.optim.SGD(params, lr=0.5), [group], [[0.6, 0.0]], preset, tok.pad_token_id,
                  accuracy=[[1.0, 0.0]])
    assert _sequence_logprob(model, group[0], preset.rl.temperature) > right_before + 1e-3


def _encoded_rows(tok, n):
    from coa_lab.training.sft import encode_example, record_messages

    return [encode_example(tok, record_messages(r), r.text) for r in _records(n)]


@pytest.mark.model
def test_gradient_norms_of_the_two_terms_are_logged_apart():
    from coa_lab.rl.update import policy_update

    def run(pg_coef, sft_coef, mix=True):
        preset = get_preset("cpu-smoke", rl={"mini_batches": 1, "pg_coef": pg_coef, "sft_coef": sft_coef})
        model, tok = _fresh(preset)
        opt, sched = optim.build_optimizer([p for p in model.parameters() if p.requires_grad], preset.rl)
        return policy_update(model, opt, [_group(tok, preset)], [[1.0, 0.0]], preset, tok.pad_token_id,
                             sft_batches=[_encoded_rows(tok, 2)] if mix else None, scheduler=sched)

    pg_only = run(1.0, 0.0, mix=False)
    assert pg_only["grad_norm_pg"] > 0 and "grad_norm_sft" not in pg_only
    sft_only = run(0.0, 1.0)
    assert sft_only["grad_norm_pg"] == 0.0 and sft_only["grad_norm_sft"] > 0
    both = run(1.0, 1.0)
    # the same weights and data: each term's norm is what it is alone
    assert both["grad_norm_pg"] == pytest.approx(pg_only["grad_norm_pg"], rel=1e-4)
    assert both["grad_norm_sft"] == pytest.approx(sft_only["grad_norm_sft"], rel=1e-4)


def _train(preset, out, **kw):
    from coa_lab.rl.trainer import train_rl
    from coa_lab.tools.registry import build_tools

    factory = kw.pop("factory", lambda model, tok: Alternating(tok, [RIGHT, WRONG]))
    return train_rl(preset, [_task()], build_tools(["code"]), out, generator_factory=factory, **kw)


RL = {"steps": 3, "prompts_per_step": 1, "group_size": 2, "max_sampling_rounds": 0, "mini_batches": 1}


@pytest.mark.model
def test_trainer_logs_delta_norm_lr_scales_and_revisit_reward(tmp_path):
    rows = _train(get_preset("cpu-smoke", rl=RL), tmp_path).metrics
    assert [r["delta_norm"] > 0 for r in rows] == [True] * 3
    assert rows[0]["delta_norm"] < rows[1]["delta_norm"] < rows[2]["delta_norm"]  # the same push every step
    lr = get_preset("cpu-smoke").rl.learning_rate
    assert [r["lr_x_n"] for r in rows] == pytest.approx([lr, 2 * lr, 3 * lr])
    assert rows[2]["lr_x_sqrt_n"] == pytest.approx(lr * math.sqrt(3))
    assert all(r["grad_norm_pg"] > 0 for r in rows)
    # one question in the pool: sampled first at step 0, revisited from step 1 on (one right, one wrong)
    assert "revisit_reward" not in rows[0] and rows[1]["revisit_reward"] == rows[2]["revisit_reward"] == 0.5


@pytest.mark.model
def test_a_resumed_run_continues_the_schedule_exactly(tmp_path):
    rl = {**RL, "steps": 4, "warmup_steps": 2, "lr_schedule": "cosine"}
    whole = _train(get_preset("cpu-smoke", rl=rl), tmp_path / "whole").metrics
    calls = {"n": 0}

    class Interrupting(Alternating):
        def generate(self, *a, **kw):
            calls["n"] += 1
            if calls["n"] == 3:  # the third step's sampling is cut off
                raise KeyboardInterrupt
            return super().generate(*a, **kw)

    with pytest.raises(KeyboardInterrupt):
        _train(get_preset("cpu-smoke", rl=rl), tmp_path / "cut", factory=lambda m, tok: Interrupting(tok, [RIGHT, WRONG]))
    state = torch.load(tmp_path / "cut" / "checkpoint" / "state.pt", weights_only=False)
    assert state["scheduler"]["last_epoch"] == 2 and state["start"] is not None
    resumed = _train(get_preset("cpu-smoke", rl=rl), tmp_path / "cut", resume=True).metrics
    assert [r["lr"] for r in resumed] == [r["lr"] for r in whole]
    assert [r["lr_x_n"] for r in resumed] == [r["lr_x_n"] for r in whole]
    assert whole[0]["lr"] == 0.0 and whole[1]["lr"] == pytest.approx(0.5 * get_preset("cpu-smoke").rl.learning_rate)
    assert [r["delta_norm"] for r in resumed] == pytest.approx([r["delta_norm"] for r in whole], rel=1e-4)
    rows = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4


@pytest.mark.model
def test_train_rl_refuses_an_unknown_advantage(tmp_path):
    with pytest.raises(ValueError, match="rl.advantage"):
        _train(get_preset("cpu-smoke", rl={**RL, "advantage": "ppo"}), tmp_path)
