"""`VLLMGenerator`: a vLLM engine in this process (GPU extra), with HFGenerator's interface."""

from __future__ import annotations

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


class VLLMGenerator:
    """vLLM engine with the same interface (GPU extra). LoRA adapters are swapped per call,
    which is how RL pushes fresh weights to the sampler without reloading the base model."""

    def __init__(self, model_path: str, tokenizer, max_lora_rank: int = 64, **engine_kwargs):
        require("vllm", "gpu")
        from vllm import LLM  # noqa: GPU path only

        self.tokenizer = tokenizer
        # the sampled token's log-prob after temperature and top-p (vLLM's default reports the raw
        # logits' log-probs): what the trainer recomputes at rl.temperature, so the probability gap
        # and truncated importance sampling (rl.tis_cap) compare like with like
        engine_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        self.engine = LLM(model=model_path, enable_lora=True, max_lora_rank=max_lora_rank, **engine_kwargs)
        self.lora = None
        self._lora_id = 0

    def set_adapter(self, adapter_dir: str | None) -> None:
        from vllm.lora.request import LoRARequest

        self._lora_id += 1
        self.lora = LoRARequest(f"policy{self._lora_id}", self._lora_id, str(adapter_dir)) if adapter_dir else None

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stop=()) -> list[Generation]:
        from vllm import SamplingParams, TokensPrompt

        sampling = temperature > 0
        params = SamplingParams(max_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                stop=list(stop), include_stop_str_in_output=True,
                                logprobs=0 if sampling else None)  # 0: the sampled token's alone
        outs = self.engine.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, lora_request=self.lora)
        results = []
        for o, p in zip(outs, prompts):
            c = o.outputs[0]
            finish = "stop" if c.stop_reason is not None and c.stop_reason != self.tokenizer.eos_token_id else (
                "eos" if c.finish_reason == "stop" else "length")
            results.append(Generation(list(c.token_ids), c.text, finish, len(p),
                                      logprobs=sampled_logprobs(c) if sampling else None))
        return results

    def chat(self, conversations, max_new_tokens, temperature=0.0) -> list[Generation]:
        prompts = [chat_prompt_ids(self.tokenizer, msgs) for msgs in conversations]
        return self.generate(prompts, max_new_tokens, temperature)
