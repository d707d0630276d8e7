"""Generation backends behind one small interface.

    gen = HFGenerator(model, tokenizer)            # CPU / any GPU: coa_lab.decoding over any HF model
    gen = VLLMGenerator(model_path)                # GPU extra: vLLM engine
    gen = OpenAIChatBackend(base_url, model)       # any OpenAI-compatible server (coa_lab/openai_backend.py)

Rollouts work on token ids, not text: RL must train on exactly the tokens the policy
sampled, and re-tokenizing decoded text can produce different ids at block boundaries.
"""

from __future__ import annotations

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
        """One turn per prompt: stops at EOS, at a stop string (kept, like the token that
        completed it) or after max_new_tokens."""
        out: list[Generation | None] = [None] * len(prompts)

        def keep(events):
            for i, gen in events:
                out[i] = gen
            return [None] * len(events)

        self.multi_turn(prompts, keep, max_new_tokens=max_new_tokens, temperature=temperature,
                        top_p=top_p, stop=stop)
        return out  # type: ignore[return-value]

    def multi_turn(self, prompts: list[list[int]], on_turn_end, *, max_new_tokens: int,
                   max_response_tokens: int | None = None, temperature: float = 0.0, top_p: float = 1.0,
                   stop: Sequence[str] = ()) -> None:
        """Multi-turn decoding that keeps each row's KV cache across tool turns
        (coa_lab.decoding.decode; `run_coa` uses it when a backend offers it)."""
        from coa_lab.decoding import decode

        decode(self.model, self.tokenizer, prompts, on_turn_end, max_new_tokens=max_new_tokens,
               max_response_tokens=max_response_tokens, temperature=temperature, top_p=top_p, stop=stop,
               batch_size=self.batch_size, compute=self.compute)

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
