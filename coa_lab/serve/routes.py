"""The endpoints of `coa-lab serve` (app.py assembles them and documents the API), one function
per group: errors and the API key, what is served, chat completions, text completions in vLLM's
fields, and vLLM's runtime LoRA loading. Every endpoint only waits on the engine's worker."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

# fastapi at the top: this module is the server's endpoints, imported only by app.py
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from coa_lab.generation.chat_prompt import chat_prompt_ids
from coa_lab.serve.adapters import AdapterAlreadyLoaded
from coa_lab.serve.batching import BatchingEngine, Job
# module level: FastAPI resolves the endpoints' annotations in this module's namespace
from coa_lab.serve.schema import (ChatRequest, CompletionRequest, LoadLoRAAdapterRequest,
                                  UnloadLoRAAdapterRequest, completion_choice, completion_logprobs,
                                  reply_text)


@dataclass
class Served:
    """What every endpoint reads: the engine, the id clients name it by, its context length and
    when the server started (the model cards' `created`)."""
    engine: BatchingEngine
    model_id: str
    context_length: int
    created: int = field(default_factory=lambda: int(time.time()))

    def lookup(self, name: str | None) -> tuple[bool, str | None]:
        """(known, adapter): the served model itself (adapter None) or a loaded LoRA."""
        if name is None or name == self.model_id:
            return True, None
        if name in self.engine.adapters.paths:
            return True, name
        return False, None

    def vocab_size(self) -> int:
        config = getattr(getattr(self.engine.generator, "model", None), "config", None)
        return int(getattr(config, "vocab_size", 0) or len(self.engine.tokenizer))

    async def generate(self, jobs: list[Job]) -> list:
        """The jobs' generations, in order, once the worker thread has decoded them."""
        return await asyncio.gather(*(asyncio.wrap_future(self.engine.submit(j)) for j in jobs))


def error(status: int, message: str, kind: str, code: str | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": code}})


def vllm_error(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    """vLLM's ErrorResponse shape (vllm/entrypoints/openai/engine/protocol.py)."""
    return JSONResponse(status_code=status,
                        content={"error": {"message": message, "type": kind, "param": param, "code": status}})


def _stop_strings(stop) -> tuple[str, ...]:
    return tuple([stop] if isinstance(stop, str) else (stop or []))


def add_errors_and_auth(app: FastAPI, api_key_env: str | None) -> None:
    """Malformed requests answer 400 in the OpenAI error shape; with `api_key_env`, every /v1/
    request must carry `Authorization: Bearer $api_key_env`."""

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_request, exc: RequestValidationError):
        problems = "; ".join(f"{'.'.join(str(x) for x in e['loc'][1:])}: {e['msg']}" for e in exc.errors())
        return error(400, f"invalid request: {problems}", "invalid_request_error")

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        if api_key_env and request.url.path.startswith("/v1/"):
            key = os.environ.get(api_key_env, "")
            if not key or request.headers.get("authorization") != f"Bearer {key}":
                return error(401, "missing or wrong API key", "invalid_request_error", "invalid_api_key")
        return await call_next(request)


def add_model_routes(app: FastAPI, served: Served) -> None:
    """GET /health and GET /v1/models: the model, and each LoRA adapter loaded at runtime."""
    adapters = served.engine.adapters

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": served.model_id, "batches": served.engine.batches,
                "adapters": sorted(adapters.paths)}

    @app.get("/v1/models")
    async def models():
        model_id, created = served.model_id, served.created
        cards = [{"id": model_id, "object": "model", "created": created, "owned_by": "coa-lab", "root": model_id,
                  "parent": None, "max_model_len": served.context_length}]
        cards += [{"id": name, "object": "model", "created": created, "owned_by": "coa-lab", "root": path,
                   "parent": model_id, "max_model_len": None} for name, path in list(adapters.paths.items())]
        return {"object": "list", "data": cards}


def add_chat_route(app: FastAPI, served: Served) -> None:
    """POST /v1/chat/completions: the OpenAI chat API, `n` samples of one conversation."""

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest):
        planned = _chat_jobs(served, req)
        if isinstance(planned, JSONResponse):
            return planned
        prompt, jobs = planned
        try:
            gens = await served.generate(jobs)
        except Exception as exc:
            return error(500, f"generation failed: {type(exc).__name__}: {exc}", "server_error")
        return _chat_reply(served, req, len(prompt), gens)


def _chat_jobs(served: Served, req: ChatRequest) -> tuple[list[int], list[Job]] | JSONResponse:
    """(the prompt's token ids, the request's `n` jobs), or the error that refuses it (unknown model, a conversation the
    chat template rejects, or more tokens than the context holds)."""
    known, adapter = served.lookup(req.model)
    adapters, model_id, context_length = served.engine.adapters, served.model_id, served.context_length
    if not known:
        return error(404, f"model {req.model!r} is not served here; this server serves {model_id!r}"
                     + (f" and the LoRA adapters {sorted(adapters.paths)}" if adapters.paths else ""),
                     "invalid_request_error", "model_not_found")
    messages = [{"role": m.role if m.role != "developer" else "system", "content": m.text()} for m in req.messages]
    try:
        prompt = chat_prompt_ids(served.engine.tokenizer, messages)
    except Exception as exc:  # a chat template that rejects this message order, say
        return error(400, f"could not apply the chat template: {exc}", "invalid_request_error")
    room = context_length - len(prompt)
    wanted = req.max_completion_tokens or req.max_tokens
    if room < 1 or (wanted is not None and wanted > room):
        return error(400, f"{len(prompt)} prompt tokens + {wanted or 1} to generate exceed the model's context "
                     f"of {context_length}", "invalid_request_error", "context_length_exceeded")
    stop = _stop_strings(req.stop)
    return prompt, [Job(prompt, wanted or min(512, room), req.temperature, req.top_p, stop, adapter)
                    for _ in range(req.n)]


def _chat_reply(served: Served, req: ChatRequest, prompt_tokens: int, gens: list):
    """The chat.completion body, or with `stream` its chunks as server-sent events."""
    choices, completion = [], 0
    for i, g in enumerate(gens):
        text, finish = reply_text(served.engine.tokenizer, g, _stop_strings(req.stop))
        completion += len(g.token_ids)
        choices.append({"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": finish})
    rid, now = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
             "total_tokens": prompt_tokens + completion}
    if not req.stream:
        return {"id": rid, "object": "chat.completion", "created": now, "model": req.model,
                "choices": choices, "usage": usage}

    def events():
        base = {"id": rid, "object": "chat.completion.chunk", "created": now, "model": req.model}
        for c in choices:
            for delta, finish in (({"role": "assistant", "content": c["message"]["content"]}, None),
                                  ({}, c["finish_reason"])):
                chunk = {**base, "choices": [{"index": c["index"], "delta": delta, "finish_reason": finish}]}
                yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def add_completion_route(app: FastAPI, served: Served) -> None:
    """POST /v1/completions: text or token-id prompts with vLLM's request and response fields."""

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest):
        known, adapter = served.lookup(req.model)
        if not known:  # vLLM's answer (OpenAIServingModels.check_model)
            return vllm_error(404, f"The model `{req.model}` does not exist.", "NotFoundError", "model")
        unsupported = req.unsupported()
        if unsupported:
            return vllm_error(400, f"{unsupported} is not supported by coa-lab serve", "BadRequestError")
        prompts = _completion_prompts(served, req)
        if isinstance(prompts, JSONResponse):
            return prompts
        stop = _stop_strings(req.stop)
        temperature = 1.0 if req.temperature is None else req.temperature
        top_p = 1.0 if req.top_p is None else req.top_p
        jobs = [Job(p, req.max_tokens or 16, temperature, top_p, stop, adapter) for p in prompts for _ in range(req.n)]
        try:
            gens = await served.generate(jobs)
        except Exception as exc:
            return vllm_error(500, f"generation failed: {type(exc).__name__}: {exc}", "InternalServerError")
        return _completion_reply(served, req, prompts, gens)


def _completion_prompts(served: Served, req: CompletionRequest) -> list[list[int]] | JSONResponse:
    """The request's prompts as token ids, or vLLM's error for an empty prompt, a token id out of
    the vocabulary, or a prompt whose completion would not fit the context."""
    empty = "Either prompt or prompt_embeds must be provided and non-empty."
    if isinstance(req.prompt, str):
        texts_or_ids = [req.prompt]
    elif req.prompt and isinstance(req.prompt[0], int):
        texts_or_ids = [req.prompt]
    else:
        texts_or_ids = list(req.prompt)
    if not texts_or_ids:
        return vllm_error(400, empty, "BadRequestError", "prompt")
    prompts: list[list[int]] = []
    for p in texts_or_ids:
        ids = (served.engine.tokenizer(p, add_special_tokens=req.add_special_tokens)["input_ids"]
               if isinstance(p, str) else list(p))
        if not ids:
            return vllm_error(400, empty, "BadRequestError", "prompt")
        prompts.append(ids)
    vocab = served.vocab_size()
    bad = next((t for p in prompts for t in p if not 0 <= t < vocab), None)
    if bad is not None:
        return vllm_error(400, f"Token id {bad} is out of vocabulary (size {vocab})", "BadRequestError", "prompt")
    max_tokens, context_length = req.max_tokens or 16, served.context_length
    for p in prompts:
        if len(p) + max_tokens > context_length:
            return vllm_error(400, f"This model's maximum context length is {context_length} tokens. However, you "
                              f"requested {len(p) + max_tokens} tokens ({len(p)} in the messages, {max_tokens} in "
                              f"the completion). Please reduce the length of the messages or completion.",
                              "BadRequestError", "max_tokens")
    return prompts


def _completion_reply(served: Served, req: CompletionRequest, prompts: list[list[int]], gens: list):
    """The text_completion body, or with `stream` one server-sent event per choice."""
    tokenizer, stop = served.engine.tokenizer, _stop_strings(req.stop)
    choices = []
    for i, g in enumerate(gens):  # prompt-major: choice i*n + j is prompt i's j-th sample, as in vLLM
        c = {"index": i, **completion_choice(tokenizer, g, stop, req.include_stop_str_in_output,
                                             req.skip_special_tokens)}
        if req.logprobs is not None:
            c["logprobs"] = completion_logprobs(tokenizer, g)
        c["prompt_token_ids"] = prompts[i // req.n] if req.return_token_ids else None
        if not req.return_token_ids:
            c["token_ids"] = None
        choices.append(c)
    prompt_tokens = sum(len(p) for p in prompts)
    completion_tokens = sum(len(g.token_ids) for g in gens)
    body = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": req.model or served.model_id, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}
    if not req.stream:
        return body

    def events():
        for c in choices:
            yield f"data: {json.dumps({**body, 'choices': [c], 'usage': None})}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def add_lora_routes(app: FastAPI, served: Served) -> None:
    """POST /v1/load_lora_adapter and /v1/unload_lora_adapter, with vLLM's success strings and
    errors. The engine's worker thread loads and removes adapters, between batches."""
    engine, adapters, model_id = served.engine, served.engine.adapters, served.model_id

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(req: LoadLoRAAdapterRequest):
        name, path = req.lora_name, req.lora_path
        if not name or not path:
            return vllm_error(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        if name == model_id:
            return vllm_error(400, f"'{name}' is the served model's own name; pick another lora_name.",
                              "InvalidUserInput")
        already = (f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in "
                   "place, set 'load_inplace' to True.")
        if name in adapters.paths:
            return vllm_error(400, already, "InvalidUserInput")
        if not (Path(path) / "adapter_config.json").is_file():  # vLLM's LoRAAdapterNotFoundError
            return vllm_error(404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")
        try:
            await asyncio.wrap_future(engine.call(lambda: adapters.load(name, path)))
        except AdapterAlreadyLoaded:
            return vllm_error(400, already, "InvalidUserInput")
        except Exception as exc:  # not a LoRA for this model (shapes, modules), unreadable weights, ...
            return vllm_error(500, f"Loading lora {name} failed: {type(exc).__name__}: {exc}",
                              "InternalServerError")
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(req: UnloadLoRAAdapterRequest):
        name = req.lora_name
        if not name:
            return vllm_error(400, "'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput")
        if name not in adapters.paths:
            return vllm_error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        try:
            await asyncio.wrap_future(engine.call(lambda: adapters.unload(name)))
        except KeyError:  # a concurrent unload got there first
            return vllm_error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        except Exception as exc:
            return vllm_error(500, f"Failed to remove lora adapter '{name}': {type(exc).__name__}: {exc}",
                              "InternalServerError")
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")
