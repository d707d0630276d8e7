"""What `coa-lab serve` reads and writes: the request bodies of its OpenAI / vLLM endpoints
(pydantic models) and a generation as a chat reply or a vLLM completion choice."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_N = 16


# The request schemas (module level: serve.py imports them at its module level, where FastAPI
# resolves the endpoints' annotations).
class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):  # content parts: keep the text ones
            return "".join(p.get("text", "") for p in self.content if p.get("type") == "text")
        return self.content or ""


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # unknown OpenAI fields (seed, user, ...) are ignored
    model: str
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    stream: bool = False


class CompletionRequest(BaseModel):
    """vLLM's /v1/completions fields that the lab's decoder can honour (vLLM:
    vllm/entrypoints/openai/completion/protocol.py, CompletionRequest); fields it cannot honour
    are refused with a 400 rather than ignored."""
    model_config = ConfigDict(extra="ignore")  # seed, user, request_id, ... are ignored
    model: str | None = None  # None: the model as served
    prompt: list[int] | list[list[int]] | str | list[str]
    max_tokens: int | None = Field(default=16, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True  # decode() of a fast tokenizer adds none either way
    add_special_tokens: bool = True  # text prompts only
    return_token_ids: bool | None = None
    stream: bool = False
    # accepted only at values that change nothing (what VLLMServerGenerator sends)
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # 0: the sampled token's log-prob alone, after temperature (vLLM's --logprobs-mode
    # processed_logprobs), when sampling; what RL's sampler asks for
    logprobs: int | None = None
    # not supported here
    echo: bool = False
    use_beam_search: bool = False

    def unsupported(self) -> str | None:
        if self.echo:
            return "echo"
        if self.logprobs not in (None, 0):
            return "logprobs other than 0 (the sampled token's)"
        if self.logprobs == 0 and not self.temperature:
            return "logprobs at temperature 0"
        if self.use_beam_search:
            return "use_beam_search"
        if self.top_k not in (None, 0, -1):
            return "top_k other than -1 / 0"
        if self.min_p not in (None, 0.0):
            return "min_p other than 0"
        if self.repetition_penalty not in (None, 1.0):
            return "repetition_penalty other than 1"
        if self.presence_penalty not in (None, 0.0) or self.frequency_penalty not in (None, 0.0):
            return "presence / frequency penalties"
        return None


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # load_inplace, ...
    lora_name: str = ""
    lora_path: str = ""


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: str = ""


def reply_text(tokenizer, gen, stop: tuple[str, ...]) -> tuple[str, str]:
    """(text, OpenAI finish_reason) of a generation: special tokens dropped, and the output
    cut before the first stop string (OpenAI does not return the stop sequence)."""
    text = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
    cut = min((text.find(s) for s in stop if s and s in text), default=-1)
    if cut >= 0:
        return text[:cut], "stop"
    return text, "length" if gen.finish_reason == "length" else "stop"


def completion_logprobs(tokenizer, gen) -> dict | None:
    """OpenAI's completion `logprobs` object for the sampled tokens (no top alternatives)."""
    if gen.logprobs is None:
        return None
    return {"tokens": [tokenizer.decode([t]) for t in gen.token_ids], "token_logprobs": list(gen.logprobs),
            "top_logprobs": None, "text_offset": None}


def completion_choice(tokenizer, gen, stop: tuple[str, ...], include_stop: bool, skip_special: bool) -> dict:
    """A vLLM completion choice for a generation: `text` as vLLM detokenizes it (cut after the
    stop string when include_stop, before it otherwise; a stop token's text only with
    include_stop), `finish_reason` "stop" / "length", `stop_reason` the stop string (None for
    EOS), and `token_ids` every sampled id (the EOS token included, as in vLLM)."""
    ids = list(gen.token_ids)
    text_ids = ids[:-1] if gen.finish_reason == "eos" and not include_stop else ids
    text = tokenizer.decode(text_ids, skip_special_tokens=skip_special)
    stop_reason = None
    if gen.finish_reason == "stop":
        hits = [(text.find(s), -len(s), s) for s in stop if s and s in text]
        if hits:
            pos, _, stop_reason = min(hits)
            text = text[:pos + len(stop_reason)] if include_stop else text[:pos]
        else:  # matched across special tokens that this text leaves out
            raw = tokenizer.decode(ids, skip_special_tokens=False)
            stop_reason = next((s for s in stop if s and s in raw), None)
    return {"text": text, "logprobs": None, "finish_reason": "length" if gen.finish_reason == "length" else "stop",
            "stop_reason": stop_reason, "token_ids": ids}
