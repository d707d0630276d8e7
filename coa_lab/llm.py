"""Generation backends behind one small interface.

    gen = HFGenerator(model, tokenizer)            # CPU / any GPU, transformers.generate
    gen = VLLMGenerator(model_path)                # GPU extra: vLLM engine
    gen = OpenAIChatBackend(base_url, model)       # any OpenAI-compatible server (teacher)

Rollouts work on token ids, not text: RL must train on exactly the tokens the policy
sampled, and re-tokenizing decoded text can produce different ids at block boundaries.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence


@dataclass
class Generation:
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop" (hit a stop string), "eos", or "length"
    prompt_tokens: int = 0
    completion_tokens: int = -1  # remote backends report a count but no ids

    def __post_init__(self) -> None:
        if self.completion_tokens < 0:
            self.completion_tokens = len(self.token_ids)


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a chat prompt ending where the assistant's turn starts."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _cut_at_stop(tokenizer, ids: list[int], stops: Sequence[str]) -> tuple[list[int], bool]:
    """Shortest prefix of `ids` whose text contains a stop string (binary search: once a
    prefix contains one, every longer prefix does too)."""
    if not stops or not any(s in tokenizer.decode(ids) for s in stops):
        return ids, False
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in tokenizer.decode(ids[:mid]) for s in stops):
            hi = mid
        else:
            lo = mid + 1
    return ids[:lo], True


class HFGenerator:
    """Batched transformers generation with stop strings, on whatever device the model is."""

    def __init__(self, model, tokenizer, batch_size: int = 16, compute=None):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        # a context-manager factory for the forward passes (coa_lab.models.compute_context)
        self.compute = compute

    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stop: Sequence[str] = (),
    ) -> list[Generation]:
        out: list[Generation] = []
        for i in range(0, len(prompts), self.batch_size):
            out.extend(self._generate_batch(prompts[i : i + self.batch_size], max_new_tokens, temperature, top_p, stop))
        return out

    def _generate_batch(self, prompts, max_new_tokens, temperature, top_p, stop) -> list[Generation]:
        import torch

        tok = self.tokenizer
        width = max(len(p) for p in prompts)
        pad = tok.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        device = next(self.model.parameters()).device
        sampling = temperature > 0
        kwargs = dict(
            max_new_tokens=max_new_tokens, do_sample=sampling, pad_token_id=pad,
            eos_token_id=tok.eos_token_id,
            # explicit: enabling gradient checkpointing for training flips config.use_cache
            # off, and generating without a KV cache recomputes the whole prefix every token
            use_cache=True,
        )
        if sampling:
            kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
        if stop:
            kwargs.update(stop_strings=list(stop), tokenizer=tok)
        was_training = self.model.training
        self.model.eval()
        import contextlib

        with torch.no_grad(), (self.compute() if self.compute else contextlib.nullcontext()):
            seqs = self.model.generate(input_ids=input_ids.to(device), attention_mask=attention.to(device), **kwargs)
        if was_training:
            self.model.train()
        results = []
        for row, prompt in zip(seqs[:, width:].tolist(), prompts):
            # Finished rows are padded; keep tokens up to and including the first EOS.
            finish = "length"
            if tok.eos_token_id in row:
                row = row[: row.index(tok.eos_token_id) + 1]
                finish = "eos"
            row, hit_stop = _cut_at_stop(tok, row, stop)
            if hit_stop:
                finish = "stop"
            results.append(Generation(row, tok.decode(row, skip_special_tokens=False), finish, len(prompt)))
        return results

    def chat(self, conversations: list[list[dict]], max_new_tokens: int, temperature: float = 0.0) -> list[Generation]:
        """One assistant reply per conversation (used by the teacher's agents)."""
        prompts = [chat_prompt_ids(self.tokenizer, msgs) for msgs in conversations]
        gens = self.generate(prompts, max_new_tokens, temperature)
        eos = self.tokenizer.eos_token or ""
        for g in gens:
            g.text = g.text.removesuffix(eos).strip()
        return gens


class VLLMGenerator:
    """vLLM engine with the same interface (GPU extra). LoRA adapters are swapped per call,
    which is how RL pushes fresh weights to the sampler without reloading the base model."""

    def __init__(self, model_path: str, tokenizer, max_lora_rank: int = 64, **engine_kwargs):
        from coa_lab.models import require

        require("vllm", "gpu")
        from vllm import LLM  # noqa: GPU path only

        self.tokenizer = tokenizer
        self.engine = LLM(model=model_path, enable_lora=True, max_lora_rank=max_lora_rank, **engine_kwargs)
        self.lora = None
        self._lora_id = 0

    def set_adapter(self, adapter_dir: str | None) -> None:
        from vllm.lora.request import LoRARequest

        self._lora_id += 1
        self.lora = LoRARequest(f"policy{self._lora_id}", self._lora_id, str(adapter_dir)) if adapter_dir else None

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stop=()) -> list[Generation]:
        from vllm import SamplingParams, TokensPrompt

        params = SamplingParams(max_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                stop=list(stop), include_stop_str_in_output=True)
        outs = self.engine.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, lora_request=self.lora)
        results = []
        for o, p in zip(outs, prompts):
            c = o.outputs[0]
            finish = "stop" if c.stop_reason is not None and c.stop_reason != self.tokenizer.eos_token_id else (
                "eos" if c.finish_reason == "stop" else "length")
            results.append(Generation(list(c.token_ids), c.text, finish, len(p)))
        return results

    def chat(self, conversations, max_new_tokens, temperature=0.0) -> list[Generation]:
        prompts = [chat_prompt_ids(self.tokenizer, msgs) for msgs in conversations]
        return self.generate(prompts, max_new_tokens, temperature)


class OpenAIChatBackend:
    """Any OpenAI-compatible chat endpoint (vllm serve, Ollama, a hosted API) as a teacher.

    The key is read from the environment variable named by `api_key_env` at call time and
    is never stored on the object, printed or written into traces.
    """

    def __init__(self, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY", timeout_s: float = 60.0):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s

    def __repr__(self) -> str:  # no secrets in notebooks' reprs
        return f"OpenAIChatBackend(base_url={self.base_url!r}, model={self.model!r})"

    def chat(self, conversations: list[list[dict]], max_new_tokens: int, temperature: float = 0.0) -> list[Generation]:
        import httpx

        headers = {}
        key = os.environ.get(self.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        results = []
        with httpx.Client(timeout=self.timeout_s) as client:
            for msgs in conversations:
                resp = client.post(f"{self.base_url}/chat/completions", headers=headers, json={
                    "model": self.model, "messages": msgs, "max_tokens": max_new_tokens, "temperature": temperature,
                })
                if resp.status_code != 200:
                    raise RuntimeError(f"teacher endpoint {self.base_url} answered HTTP {resp.status_code}: {resp.text[:200]}")
                body = resp.json()
                usage = body.get("usage", {})
                choice = body["choices"][0]
                text = choice["message"]["content"] or ""
                results.append(Generation([], text.strip(), "eos" if choice.get("finish_reason") == "stop" else "length",
                                          int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))))
        return results


def make_generator(preset, adapter=None, model_name: str | None = None):
    """The preset's generation backend: "hf" (transformers, any device) or "vllm" (GPU extra).

    adapter: a LoRA adapter directory (SFT/RL output) to sample from; model_name: another
    model than the preset's (a stronger teacher, say)."""
    import dataclasses

    from coa_lab.models import compute_context, load_model, load_tokenizer, resolve_model

    cfg = preset.model if model_name is None else dataclasses.replace(preset.model, name=model_name, use_unsloth=False)
    if preset.gen.backend == "vllm":
        gen = VLLMGenerator(resolve_model(cfg.name), load_tokenizer(cfg.name), max_lora_rank=max(cfg.lora_r, 8))
        gen.set_adapter(adapter)
        return gen
    if preset.gen.backend != "hf":
        raise ValueError(f"unknown generation backend {preset.gen.backend!r}; use 'hf' or 'vllm'")
    model, tokenizer = load_model(cfg, adapter=adapter)
    return HFGenerator(model, tokenizer, preset.gen.batch_size, compute=lambda: compute_context(model, cfg))
