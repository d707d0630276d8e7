"""The in-process vLLM sampler: it hands RL the sampled tokens' log-probs (after temperature), so
the probability gap is logged and truncated importance sampling runs on the GPU presets, and a
process holds one engine, reused across stages and shut down before another is made. vLLM is not
installed on the CPU: a stand-in module answers as vLLM's LLM does."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass

import pytest

from coa_lab.generation import vllm_engine


@dataclass
class Logprob:
    logprob: float


class _Completion:
    def __init__(self, token_ids, logprobs):
        self.token_ids, self.logprobs, self.text = token_ids, logprobs, "x"
        self.stop_reason, self.finish_reason = None, "length"


class _LLM:
    seen: dict = {}

    def __init__(self, **kwargs):
        _LLM.seen["engine"] = kwargs
        _LLM.seen.setdefault("events", []).append(("create", kwargs["model"]))
        self.model = kwargs["model"]

    def shutdown(self):
        _LLM.seen["events"].append(("shutdown", self.model))

    def generate(self, prompts, params, lora_request=None, use_tqdm=True):
        _LLM.seen["params"] = params
        _LLM.seen["use_tqdm"] = use_tqdm
        out = []
        for k, _ in enumerate(prompts):
            ids = [10 + k, 20 + k]
            lps = [{i: Logprob(-0.5 * (j + 1))} for j, i in enumerate(ids)] if params.logprobs is not None else None
            out.append(types.SimpleNamespace(outputs=[_Completion(ids, lps)]))
        return out


class _SamplingParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams = _LLM, _SamplingParams
    module.TokensPrompt = lambda prompt_token_ids: prompt_token_ids
    lora = types.ModuleType("vllm.lora.request")
    lora.LoRARequest = lambda name, lora_id, path: types.SimpleNamespace(name=name, id=lora_id, path=path)
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.lora", types.ModuleType("vllm.lora"))
    monkeypatch.setitem(sys.modules, "vllm.lora.request", lora)
    monkeypatch.setattr(vllm_engine, "require", lambda package, extra: None)
    monkeypatch.setattr(vllm_engine, "_ENGINE", {"key": None, "llm": None})
    _LLM.seen.clear()
    yield _LLM.seen
    vllm_engine.release_engine()


def test_sampling_asks_for_processed_logprobs_and_returns_them(fake_vllm):
    tok = types.SimpleNamespace(eos_token_id=2)
    gen = vllm_engine.VLLMGenerator("model", tok)
    assert fake_vllm["engine"]["logprobs_mode"] == "processed_logprobs"  # after temperature, as the trainer scores
    outs = gen.generate([[1, 2], [3]], max_new_tokens=2, temperature=0.8)
    assert fake_vllm["params"].logprobs == 0
    assert fake_vllm["use_tqdm"] is False  # vLLM's bar divides by zero under TQDM_DISABLE=1
    assert [o.logprobs for o in outs] == [[-0.5, -1.0], [-0.5, -1.0]]
    assert outs[1].token_ids == [11, 21]


def test_greedy_decoding_asks_for_none(fake_vllm):
    gen = vllm_engine.VLLMGenerator("model", types.SimpleNamespace(eos_token_id=2))
    outs = gen.generate([[1]], max_new_tokens=2, temperature=0.0)
    assert fake_vllm["params"].logprobs is None and outs[0].logprobs is None


def test_a_caller_can_choose_another_logprobs_mode(fake_vllm):
    vllm_engine.VLLMGenerator("model", types.SimpleNamespace(eos_token_id=2), logprobs_mode="raw_logprobs")
    assert fake_vllm["engine"]["logprobs_mode"] == "raw_logprobs"


def test_missing_or_partial_logprobs_give_none_not_wrong_numbers():
    assert vllm_engine.sampled_logprobs(_Completion([1, 2], None)) is None
    assert vllm_engine.sampled_logprobs(_Completion([1, 2], [{1: Logprob(-1.0)}])) is None  # one of two
    assert vllm_engine.sampled_logprobs(_Completion([1, 2], [{1: Logprob(-1.0)}, {3: Logprob(-2.0)}])) is None
    assert vllm_engine.sampled_logprobs(_Completion([1, 2], [{1: Logprob(-1.0)}, {2: Logprob(-2.0)}])) == [-1.0, -2.0]


def test_one_engine_per_process_reused_then_shut_down_before_the_next(fake_vllm):
    """Capture, screening, RL and evaluation each build a generator: with the same model and
    settings they share one engine; another model's engine is made only after the first is shut down."""
    tok = types.SimpleNamespace(eos_token_id=2)
    evaluation = vllm_engine.VLLMGenerator("student", tok, gpu_memory_utilization=0.5)
    rl = vllm_engine.VLLMGenerator("student", tok, gpu_memory_utilization=0.5)
    assert rl.engine is evaluation.engine and fake_vllm["events"] == [("create", "student")]
    rl.set_adapter("/runs/rl/step3")
    evaluation.set_adapter("/runs/sft/adapter")
    assert rl.lora.id != evaluation.lora.id  # one engine, two adapters: never one id for both
    vllm_engine.VLLMGenerator("teacher", tok, gpu_memory_utilization=0.5)
    assert fake_vllm["events"] == [("create", "student"), ("shutdown", "student"), ("create", "teacher")]
    vllm_engine.release_engine()
    assert fake_vllm["events"][-1] == ("shutdown", "teacher") and vllm_engine._ENGINE["llm"] is None
    vllm_engine.release_engine()  # nothing left: a no-op


def test_the_rl_sampler_shares_the_evaluation_engine(fake_vllm, monkeypatch):
    """make_generator (evaluation, screening) and rl_sampler ask for the same engine settings."""
    from coa_lab.config import get_preset
    from coa_lab.generation import llm

    monkeypatch.setattr(llm, "load_tokenizer", lambda name: types.SimpleNamespace(eos_token_id=2))
    monkeypatch.setattr(llm, "resolve_model", lambda name: "student")
    monkeypatch.setattr(llm, "resolve_backend", lambda backend: "vllm")
    preset = get_preset("gpu-smoke")
    first = llm.make_generator(preset)
    second = llm.rl_sampler(preset, types.SimpleNamespace(eos_token_id=2), None)
    assert second.engine is first.engine and fake_vllm["events"] == [("create", "student")]


def test_the_engine_computes_in_the_trainers_dtype(monkeypatch):
    """vLLM's "auto" dtype would run the fp32 embedded model in bf16/fp16; the lab asks for the
    dtype its own forwards use: on a CPU fp32, or bf16 where it autocasts to bf16; on a GPU the
    preset's (fp16 on a card without bf16)."""
    import torch

    from coa_lab.generation import llm, models

    from coa_lab.config import get_preset

    cfg = get_preset("cpu-smoke").model
    monkeypatch.setenv("COA_LAB_CPU_BF16", "0")
    models.cpu_bf16_is_fast.cache_clear()
    assert llm.engine_dtype(cfg) == "float32"
    monkeypatch.setenv("COA_LAB_CPU_BF16", "1")
    models.cpu_bf16_is_fast.cache_clear()
    assert llm.engine_dtype(cfg) == "bfloat16"
    assert llm.engine_dtype(get_preset("cpu-smoke", model={"cpu_autocast_bf16": False}).model) == "float32"
    models.cpu_bf16_is_fast.cache_clear()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(llm, "effective_dtype", lambda cfg: "float16")  # a T4
    assert llm.engine_dtype(get_preset("gpu-smoke").model) == "float16"


def test_a_cpu_engine_gives_its_worker_time_for_a_slow_step(fake_vllm, monkeypatch):
    """vLLM declares an engine dead when one model step takes over 300 s, which a loaded CPU exceeded (a test
    suite's workers beside a LoRA prefill): the lab's CPU engine allows an hour, and a user's setting stays."""
    monkeypatch.delenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", raising=False)
    monkeypatch.setattr(vllm_engine.torch.cuda, "is_available", lambda: False)
    vllm_engine.VLLMGenerator("model", types.SimpleNamespace(eos_token_id=2))
    assert vllm_engine.os.environ["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] == str(vllm_engine.CPU_STEP_TIMEOUT_S)
    vllm_engine.release_engine()
    monkeypatch.setenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "42")
    vllm_engine.VLLMGenerator("other", types.SimpleNamespace(eos_token_id=2))
    assert vllm_engine.os.environ["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] == "42"
