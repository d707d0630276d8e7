"""`HFGenerator`: batched generation with any Hugging Face model, on whatever device it is,
through the lab's own cache-keeping decoder (coa_lab/generation/decoding.py)."""

from __future__ import annotations

from typing import Sequence

from coa_lab.generation.chat_prompt import chat_by_generate
from coa_lab.generation.decoding import decode
from coa_lab.generation.prefix_cache import PrefixCache
from coa_lab.generation.result import Generation


class HFGenerator:
    """Batched transformers generation with stop strings, on whatever device the model is."""

    def __init__(self, model, tokenizer, batch_size: int = 16, compute=None, keep_prefixes: bool = False):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        # a context-manager factory for the forward passes (coa_lab.generation.models.compute_context)
        self.compute = compute
        # keep_prefixes: shared prompt prefixes (an agent's instruction and worked examples)
        # prefilled once for all later calls, not once per call (coa_lab/generation/prefix_cache.py)
        self.prefix_cache = None
        if keep_prefixes:
            self.prefix_cache = PrefixCache()
        # prompt tokens the callers sent vs those actually run through a forward pass
        self.stats = {"prompt_tokens_sent": 0, "prompt_tokens_prefilled": 0}

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
                   max_response_tokens: int | None = None, temperature: "float | list[float]" = 0.0, top_p: float = 1.0,
                   stop: Sequence[str] = ()) -> None:
        """Multi-turn decoding that keeps each row's KV cache across tool turns
        (coa_lab.generation.decoding.decode; `run_coa` uses it when a backend offers it)."""
        decode(self.model, self.tokenizer, prompts, on_turn_end, max_new_tokens=max_new_tokens,
               max_response_tokens=max_response_tokens, temperature=temperature, top_p=top_p, stop=stop,
               batch_size=self.batch_size, compute=self.compute, prefix_cache=self.prefix_cache, stats=self.stats)

    def chat(self, conversations: list[list[dict]], max_new_tokens: int, temperature: float = 0.0) -> list[Generation]:
        """One assistant reply per conversation (used by the teacher's agents)."""
        return chat_by_generate(self, conversations, max_new_tokens, temperature)
