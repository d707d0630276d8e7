"""The DAPO loop around the pure functions: dynamic sampling on accuracy, the update itself,
and a full train_rl run whose rollouts come from a scripted policy (so rewards are known)."""

import json
import random

import pytest
import torch

from coa_lab.student_rollout import run_coa
from coa_lab.config import get_preset
from coa_lab.evaluate import evaluate
from coa_lab.generation.models import load_model
from coa_lab.generation.result import Generation
from coa_lab.rl.rollouts import collect_batch, score_rollouts
from coa_lab.rl.trainer import train_rl
from coa_lab.rl.update import policy_update
from coa_lab.tasks.records import Task
from coa_lab.tools.registry import build_tools
from coa_lab.trajectories import load_records

pytestmark = pytest.mark.model


class Alternating:
    """Rollout i answers outputs[i % len(outputs)]: a policy with a known success rate."""

    def __init__(self, tokenizer, outputs):
        self.tokenizer, self.outputs = tokenizer, outputs

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stop=()):
        out = []
        for i, p in enumerate(prompts):
            ids = self.tokenizer(self.outputs[i % len(self.outputs)], add_special_tokens=False)["input_ids"]
            out.append(Generation(ids, self.tokenizer.decode(ids), "stop", len(p)))
        return out


TASKS = [Task(f"t{i}", f"What is {i} + {i}?", [str(2 * i)], "test", "math", {}) for i in range(1, 7)]


@pytest.fixture(scope="module")
def model_and_tok():
    return load_model(get_preset("cpu-smoke").model, trainable=True)


def test_dynamic_sampling_keeps_only_groups_with_mixed_accuracy(model_and_tok):
    _, tok = model_and_tok
    preset = get_preset("cpu-smoke", rl={"prompts_per_step": 2, "group_size": 2, "max_sampling_rounds": 2})
    right_then_wrong = Alternating(tok, ["<think>t</think><answer>\\boxed{2}</answer>", "<think>t</think><answer>\\boxed{0}</answer>"])
    # task t1's gold is 2: rollouts alternate right/wrong -> informative; others: all wrong
    pool = iter([TASKS[0], TASKS[1], TASKS[0], TASKS[2], TASKS[0], TASKS[3]])
    groups, rewards, stats = collect_batch(right_then_wrong, pool, build_tools(["code"]), preset)
    assert [g[0].task.id for g in groups] == ["t1", "t1"]
    assert stats["rounds"] == 2 and stats["sampled_groups"] == 3  # 2 drawn, then 1 refill
    assert all(sorted(r) == [0.0, 1.0] for r in rewards)


class SolvesThreePlusThree(Alternating):
    """Always right on "What is 3 + 3?" (an anchor the policy still solves), and answers the
    other questions outputs[i % len(outputs)] as Alternating does."""

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stop=()):
        out = super().generate(prompts, max_new_tokens, temperature, top_p, stop)
        for i, p in enumerate(prompts):
            if "What is 3 + 3?" in self.tokenizer.decode(p):
                ids = self.tokenizer("<think>t</think><answer>\\boxed{6}</answer>", add_special_tokens=False)["input_ids"]
                out[i] = Generation(ids, self.tokenizer.decode(ids), "stop", len(p))
        return out


def test_anchor_groups_enter_the_batch_only_when_the_policy_fails_them(model_and_tok):
    _, tok = model_and_tok
    preset = get_preset("cpu-smoke", rl={"prompts_per_step": 1, "group_size": 2, "max_sampling_rounds": 1,
                                         "anchors_per_step": 2})
    policy = SolvesThreePlusThree(tok, ["<think>t</think><answer>\\boxed{2}</answer>", "<think>t</think><answer>\\boxed{0}</answer>"])
    # pool: t1 (gold 2) -> right, wrong: informative. Anchors: t3 always solved -> dropped;
    # t1 as an anchor -> half wrong, as if the policy had drifted -> kept.
    groups, _, stats = collect_batch(policy, iter([TASKS[0]]), build_tools(["code"]), preset,
                                     anchor_iter=iter([TASKS[2], TASKS[0]]))
    assert [g[0].task.id for g in groups] == ["t1", "t1"]
    assert stats["rounds"] == 1 and stats["sampled_groups"] == 3
    assert stats["anchor_groups"] == 2 and stats["anchor_groups_kept"] == 1 and stats["anchor_solved"] == 3


def test_score_rollouts_shapes_but_accuracy_stays_binary(model_and_tok):
    _, tok = model_and_tok
    long_answer = "<think>" + "a " * 120 + "</think><answer>\\boxed{2}</answer>"
    gen = Alternating(tok, [long_answer])
    cfg = get_preset("cpu-smoke", gen={"max_new_tokens": 400, "max_response_tokens": 400}).gen
    rollouts = run_coa(gen, TASKS[:1], build_tools(["code"]), cfg)
    assert not rollouts[0].truncated and 100 < len(rollouts[0].response_ids) < 160
    accuracy, shaped = score_rollouts(rollouts, max_len=160, buffer=100)
    assert accuracy == [1.0] and shaped[0] < 1.0  # correct but too long: punished softly


def test_overlong_punishment_counts_the_policys_tokens_not_the_tool_output(model_and_tok):
    """A short correct answer after a long tool output: the observation is the environment's, so
    the soft overlong punishment (which ramps from max_len - buffer) must not touch it."""
    from coa_lab.tools.registry import FunctionTool, ToolRegistry

    _, tok = model_and_tok

    class CallThenAnswer(Alternating):
        def __init__(self, tokenizer):
            super().__init__(tokenizer, ["<code>print(1)</code>"])
            self.calls = 0

        def generate(self, prompts, *args, **kwargs):
            answer = "<think>t</think><answer>\\boxed{2}</answer>"
            self.outputs = ["<code>print(1)</code>" if self.calls == 0 else answer]
            self.calls += 1
            return super().generate(prompts, *args, **kwargs)

    tools = ToolRegistry([FunctionTool("code", "prints a long page", lambda arg: "word " * 180)])
    cfg = get_preset("cpu-smoke", gen={"max_turns": 3, "max_response_tokens": 400, "observation_chars": 2000}).gen
    [r] = run_coa(CallThenAnswer(tok), TASKS[:1], tools, cfg)
    assert r.finish == "answer" and not r.truncated
    assert r.policy_tokens < 40 and len(r.response_ids) - r.policy_tokens > 150  # mostly observation
    accuracy, shaped = score_rollouts([r], max_len=400, buffer=300)  # the ramp starts at 100 tokens
    assert accuracy == [1.0] and shaped == [1.0]


def test_policy_update_moves_only_lora_weights(model_and_tok):
    model, tok = model_and_tok
    preset = get_preset("cpu-smoke")
    gen = Alternating(tok, ["<code>\nprint(2)\n</code>", "<think>t</think><answer>\\boxed{2}</answer>"])
    rollouts = run_coa(gen, [TASKS[0]], build_tools(["code"]), preset.gen, samples=2)
    lora = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad and "embed" in n}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    stats = policy_update(model, opt, [rollouts], [[1.0, 0.0]], preset, tok.pad_token_id)
    assert torch.isfinite(torch.tensor(stats["loss"]))
    assert stats["masked_observation_tokens"] == sum(r.response_mask.count(0) for r in rollouts)
    assert stats["train_tokens"] == sum(sum(r.response_mask) for r in rollouts)
    changed = [n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(p, lora[n])]
    assert changed
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)


def _two_groups(tok, preset):
    gen = Alternating(tok, ["<think>t</think><answer>\\boxed{2}</answer>", "<think>t</think><answer>\\boxed{5}</answer>"])
    rollouts = run_coa(gen, TASKS[:2], build_tools(["code"]), preset.gen, samples=2)
    return [rollouts[:2], rollouts[2:]], [[1.0, 0.0], [0.0, 1.0]]


def test_old_logprobs_are_computed_only_for_the_mini_batches_after_the_first(model_and_tok, monkeypatch):
    # the first mini-batch trains before any weight moves: its own forward is the old policy
    from coa_lab.training import packing

    model, tok = model_and_tok
    preset = get_preset("cpu-smoke", rl={"mini_batches": 2})
    groups, rewards = _two_groups(tok, preset)
    calls = []
    real = packing.sequence_logprobs

    def counting(model_, sequences, *args, **kwargs):
        calls.append((torch.is_grad_enabled(), len(sequences)))
        return real(model_, sequences, *args, **kwargs)

    monkeypatch.setattr(packing, "sequence_logprobs", counting)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    stats = policy_update(model, opt, groups, rewards, preset, tok.pad_token_id)
    assert sum(n for grad, n in calls if not grad) == 2  # old log-probs: the second mini-batch only
    assert sum(n for grad, n in calls if grad) == 4  # every rollout trained once
    assert all(n == 2 for _, n in calls)  # one group per forward: its prompt is shared
    assert torch.isfinite(torch.tensor(stats["loss"]))


def test_packed_update_equals_padded_update(monkeypatch):
    """The packed forward (one row per group) must leave the same weights and statistics as
    the padded one."""
    from coa_lab.training import packing

    preset = get_preset("cpu-smoke", rl={"mini_batches": 2})
    results = []
    for use_packing in (True, False):
        torch.manual_seed(0)  # the same LoRA initialisation
        model, tok = load_model(preset.model, trainable=True)
        monkeypatch.setattr(packing, "supported", lambda m, on=use_packing: on)
        groups, rewards = _two_groups(tok, preset)
        # SGD: Adam's first step is ~lr * sign(g), which turns float noise on near-zero gradients into lr
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
        random.seed(0)  # the same mini-batch order
        before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
        stats = policy_update(model, opt, groups, rewards, preset, tok.pad_token_id)
        moved = max(float((p.detach() - b).abs().max()) for p, b in zip(
            (p for p in model.parameters() if p.requires_grad), before))
        assert moved > 1e-3  # far above the tolerance below: the comparison can fail
        results.append((stats, [p.detach().clone() for p in model.parameters() if p.requires_grad]))
    (packed_stats, packed_w), (padded_stats, padded_w) = results
    for k in ("loss", "ratio_mean", "approx_kl"):
        assert packed_stats[k] == pytest.approx(padded_stats[k], abs=1e-5)
    for a, b in zip(packed_w, padded_w):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-3)


def test_mini_batches_are_whole_groups_and_micro_batches_one_groups_rollouts():
    from coa_lab.rl.update_batch import MICRO_BATCH, micro_batches as _micro_batches

    groups = [["a"] * 4, ["b"] * 6, ["c"] * 4]  # rollout indices 0-3, 4-9, 10-13
    mbs = _micro_batches(groups, 2)
    assert len(mbs) == 2
    assert sorted(i for mb in mbs for sub in mb for i in sub) == list(range(14))
    for mb in mbs:
        for sub in mb:
            assert len(sub) <= MICRO_BATCH
            assert len({0 if i < 4 else 1 if i < 10 else 2 for i in sub}) == 1  # one group per forward
    assert len(_micro_batches(groups[:1], 2)) == 1  # never more steps than groups


def test_train_rl_logs_steps_and_saves_adapter(tmp_path):
    preset = get_preset("cpu-smoke", rl={"steps": 2, "prompts_per_step": 1, "group_size": 2, "max_sampling_rounds": 0})
    factory = lambda model, tok: Alternating(tok, ["<think>t</think><answer>\\boxed{2}</answer>", "<think>t</think><answer>\\boxed{5}</answer>"])  # noqa: E731
    result = train_rl(preset, [TASKS[0]], build_tools(["code"]), tmp_path, generator_factory=factory)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 == len(result.metrics)
    assert all(r["kept_groups"] == 1 and r["accuracy"] == 0.5 and "loss" in r for r in rows)
    assert all(r["signal_rollouts"] == 2 for r in rows)  # both samples of the mixed group carry a gradient
    assert (result.adapter_dir / "adapter_config.json").exists()
    assert len(load_records(tmp_path / "rollouts.jsonl")) == 2 * 2  # 2 steps x group of 2


def test_train_rl_logs_the_task_reward_and_the_shaped_reward_apart(tmp_path):
    """A right but long answer (shaped below 1 by the overlong punishment) and a short wrong one:
    the row's task reward is the binary mean, its shaped reward the mean the advantages used."""
    long_right = "<think>" + "a " * 120 + "</think><answer>\\boxed{2}</answer>"
    preset = get_preset("cpu-smoke", gen={"max_response_tokens": 400},
                        rl={"steps": 1, "prompts_per_step": 1, "group_size": 2, "max_sampling_rounds": 0,
                            "overlong_buffer": 300})
    factory = lambda model, tok: Alternating(tok, [long_right, "<think>t</think><answer>\\boxed{5}</answer>"])  # noqa: E731
    [row] = train_rl(preset, [TASKS[0]], build_tools(["code"]), tmp_path, generator_factory=factory).metrics
    records = load_records(tmp_path / "rollouts.jsonl")
    assert sorted(r.reward for r in records) == [0.0, 1.0]
    assert row["reward_task_mean"] == 0.5
    shaped = [r.metadata["shaped_reward"] for r in records]
    assert row["reward_shaped_mean"] == pytest.approx(sum(shaped) / 2) and row["reward_shaped_mean"] < 0.5
    assert "reward_mean" not in row  # the name that did not say which of the two it was
    # the policy's own tokens beside every token of the response (both, here: no tool was called)
    assert row["response_len_policy"] == row["response_len_sampled"] > 60


def test_train_rl_reports_pool_accuracy_apart_from_anchors(tmp_path):
    preset = get_preset("cpu-smoke", rl={"steps": 1, "prompts_per_step": 1, "group_size": 2,
                                         "max_sampling_rounds": 0, "anchors_per_step": 1})
    factory = lambda model, tok: SolvesThreePlusThree(tok, ["<think>t</think><answer>\\boxed{2}</answer>", "<think>t</think><answer>\\boxed{5}</answer>"])  # noqa: E731
    result = train_rl(preset, [TASKS[0]], build_tools(["code"]), tmp_path, generator_factory=factory,
                      anchors=[TASKS[2]])
    row = result.metrics[0]
    assert row["accuracy"] == 0.5 and row["anchor_accuracy"] == 1.0  # not 0.75 over all 4 rollouts
    assert row["anchor_groups"] == 1 and row["anchor_groups_kept"] == 0 and row["kept_groups"] == 1
    assert len(load_records(tmp_path / "rollouts.jsonl")) == 4  # anchors' samples are kept to inspect too


def test_interrupted_rl_keeps_the_last_finished_step(tmp_path):
    preset = get_preset("cpu-smoke", rl={"steps": 3, "prompts_per_step": 1, "group_size": 2, "max_sampling_rounds": 0})
    calls = {"n": 0}

    class Interrupting(Alternating):
        def generate(self, *a, **kw):
            calls["n"] += 1
            if calls["n"] == 2:  # the second step's sampling is cut off (Ctrl-C, a killed job)
                raise KeyboardInterrupt
            return super().generate(*a, **kw)

    factory = lambda model, tok: Interrupting(tok, ["<think>t</think><answer>\\boxed{2}</answer>", "<think>t</think><answer>\\boxed{5}</answer>"])  # noqa: E731
    with pytest.raises(KeyboardInterrupt):
        train_rl(preset, [TASKS[0]], build_tools(["code"]), tmp_path, generator_factory=factory)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and "loss" in rows[0]
    assert (tmp_path / "adapter" / "adapter_config.json").exists()  # step 0's updated policy survived
    assert len(load_records(tmp_path / "rollouts.jsonl")) == 2


def test_without_dynamic_sampling_an_all_wrong_group_is_trained_on_and_wasted(tmp_path):
    # the "no dynamic sampling" ablation arm: the group stays in the batch, its advantages are 0
    preset = get_preset("cpu-smoke", rl={"steps": 1, "prompts_per_step": 1, "group_size": 2, "max_sampling_rounds": 0,
                                         "dynamic_sampling": False, "loss_agg": "sequence"})
    factory = lambda model, tok: Alternating(tok, ["<think>t</think><answer>\\boxed{5}</answer>"])  # noqa: E731 - always wrong
    row = train_rl(preset, [TASKS[0]], build_tools(["code"]), tmp_path, generator_factory=factory).metrics[0]
    assert row["kept_groups"] == 1 and row["accuracy"] == 0.0
    assert row["signal_rollouts"] == 0 and row["loss"] == 0.0


def test_the_trainer_rewards_exactly_what_evaluation_scores(model_and_tok):
    """One scorer for eval and reward, through each stage's own code path (answer extraction
    included): the same rollouts get the same numbers from RL's score_rollouts and evaluate()."""
    _, tok = model_and_tok
    outputs = ["<answer>\\boxed{2}</answer>", "<answer>2</answer>", "<answer>\\boxed{3}</answer>",
               "The answer is 2.", "<answer>2|4</answer>", "<answer>\\boxed{2.0}</answer>"]
    preset = get_preset("cpu-smoke")
    tasks = [TASKS[0]] * len(outputs)
    rollouts = run_coa(Alternating(tok, outputs), tasks, build_tools(["code"]), preset.gen)
    ungated, _ = score_rollouts(rollouts, preset.gen.max_response_tokens, preset.rl.overlong_buffer, format_gate=False)
    evaluated = evaluate(Alternating(tok, outputs), {"math/test": tasks}, build_tools(["code"]), preset)
    assert ungated == [r.reward for r in evaluated.records]
    assert 0.0 in ungated and 1.0 in ungated  # both outcomes occur: the comparison can fail


def test_the_format_gate_zeroes_exactly_the_grammar_violations(model_and_tok):
    """rl.format_reward (on by default): the reward is evaluation's score where evaluation calls
    the format valid, and 0 where it does not -- a right answer after a skipped <think> earns
    nothing, as a format error aborts an AFM run."""
    _, tok = model_and_tok
    outputs = ["<think>t</think><answer>\\boxed{2}</answer>", "<answer>\\boxed{2}</answer>",
               "<plan>p</plan>\n<think>t</think>\n<reflection>r</reflection>\n<answer>\\boxed{2}</answer>",
               "<think>t</think><answer>\\boxed{3}</answer>"]
    preset = get_preset("cpu-smoke")
    assert preset.rl.format_reward
    tasks = [TASKS[0]] * len(outputs)
    rollouts = run_coa(Alternating(tok, outputs), tasks, build_tools(["code"]), preset.gen)
    gated, _ = score_rollouts(rollouts, preset.gen.max_response_tokens, preset.rl.overlong_buffer)
    evaluated = evaluate(Alternating(tok, outputs), {"math/test": tasks}, build_tools(["code"]), preset)
    scores = [r.reward for r in evaluated.records]
    valid = [r.metadata["valid"] for r in evaluated.records]
    assert scores == [1.0, 1.0, 1.0, 0.0] and valid == [True, False, False, True]
    assert gated == [s if v else 0.0 for s, v in zip(scores, valid)] == [1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("section, field_, value, fix", [
    ("gen", "top_p", 0.9, "gen.top_p=1.0"),  # sampled from a nucleus the trainer never scores
    ("model", "lora_dropout", 0.05, "model.lora_dropout=0.0"),  # the trained forward is not the sampler's
])
def test_train_rl_refuses_settings_that_break_the_logprob_identity(tmp_path, monkeypatch, section, field_, value, fix):
    import coa_lab.generation.models as models

    def no_load(*a, **kw):
        raise AssertionError("the model was loaded before the settings were checked")

    monkeypatch.setattr(models, "load_model", no_load)
    preset = get_preset("cpu-smoke", **{section: {field_: value}})
    with pytest.raises(ValueError) as err:
        train_rl(preset, [TASKS[0]], build_tools(["code"]), tmp_path / "rl")
    message = str(err.value)
    assert f"{section}.{field_}={value}" in message and fix in message and "\n" not in message
    assert not (tmp_path / "rl").exists()  # refused before anything was written
