"""`coa-lab serve`: a lab model behind an OpenAI-compatible HTTP API, on loopback.

    coa-lab serve embedded:smollm2-135m-instruct --port 8000
    coa-lab serve runs/demo/sft/adapter              # a trained adapter (its base is read from it)
    coa-lab serve Qwen/Qwen2.5-3B-Instruct --adapter runs/x/rl/adapter --name my-student

Then anything that speaks the OpenAI chat API can use it: the lab's own capture as a teacher
(`--set capture.teacher_url=http://127.0.0.1:8000/v1 --set capture.teacher_model=<id>`),
an LLM judge, or an outside evaluation harness.

    GET  /v1/models             the one model served, under its id
    POST /v1/chat/completions   messages, max_tokens, temperature, top_p, n, stop, stream
    GET  /health

Requests that arrive together are decoded together: a worker thread takes everything queued
(up to `max_batch` conversations, same sampling settings) and runs ONE batched generate, so
eight concurrent clients cost about as much as one batch, not eight sequential replies. The
endpoints are async and only wait on that worker, so the server keeps accepting while it
decodes. `stream: true` is answered in server-sent-event form, but with the whole reply in
one chunk (the batch decodes all rows before any is returned).

Built on FastAPI + uvicorn. Bound to 127.0.0.1 by default; `--api-key-env VAR` makes it
require `Authorization: Bearer $VAR` (the key is read from the environment, never printed).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from coa_lab.llm import chat_prompt_ids

MAX_N = 16


@dataclass
class _Job:
    prompt: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    future: Future = field(default_factory=Future)

    @property
    def key(self) -> tuple:
        return (self.max_tokens, self.temperature, self.top_p, self.stop)


class BatchingEngine:
    """Decodes queued jobs in batches on one worker thread (the model is not thread-safe).

    generator: anything with `.tokenizer` and `.generate(prompts, max_new_tokens, temperature,
    top_p, stop)` (coa_lab.llm.HFGenerator). wait_s: how long the worker lingers for more jobs
    once one arrives (requests of one client burst arrive a few ms apart)."""

    def __init__(self, generator, max_batch: int = 32, wait_s: float = 0.02):
        self.generator = generator
        self.tokenizer = generator.tokenizer
        self.max_batch = max(1, max_batch)
        self.wait_s = wait_s
        self.batches = 0  # for tests and /health: how many batched generate calls ran
        self._queue: queue.Queue[_Job] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="coa-serve-engine", daemon=True)
        self._thread.start()

    def submit(self, job: _Job) -> Future:
        self._queue.put(job)
        return job.future

    def _take(self) -> list[_Job]:
        jobs = [self._queue.get()]
        deadline = time.monotonic() + self.wait_s
        while len(jobs) < self.max_batch:
            try:
                jobs.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        return jobs

    def _loop(self) -> None:
        while True:
            jobs = self._take()
            groups: dict[tuple, list[_Job]] = {}
            for j in jobs:
                groups.setdefault(j.key, []).append(j)
            for (max_tokens, temperature, top_p, stop), group in groups.items():
                try:
                    gens = self.generator.generate([j.prompt for j in group], max_tokens, temperature, top_p, stop)
                    self.batches += 1
                except Exception as exc:  # a failed batch fails its requests, not the server
                    for j in group:
                        j.future.set_exception(exc)
                    continue
                for j, g in zip(group, gens):
                    j.future.set_result(g)


# The request schema (module level: FastAPI resolves the endpoint's annotations here).
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


def reply_text(tokenizer, gen, stop: tuple[str, ...]) -> tuple[str, str]:
    """(text, OpenAI finish_reason) of a generation: special tokens dropped, and the output
    cut before the first stop string (OpenAI does not return the stop sequence)."""
    text = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
    cut = min((text.find(s) for s in stop if s and s in text), default=-1)
    if cut >= 0:
        return text[:cut], "stop"
    return text, "length" if gen.finish_reason == "length" else "stop"


def create_app(engine: BatchingEngine, model_id: str, context_length: int, api_key_env: str | None = None):
    """The FastAPI app serving `engine` as `model_id`."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI(title="coa-lab serve", version="1")
    created = int(time.time())

    def error(status: int, message: str, kind: str, code: str | None = None) -> JSONResponse:
        return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": code}})

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

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_id, "batches": engine.batches}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": created,
                                            "owned_by": "coa-lab"}]}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest):
        if req.model != model_id:
            return error(404, f"model {req.model!r} is not served here; this server serves {model_id!r}",
                         "invalid_request_error", "model_not_found")
        messages = [{"role": m.role if m.role != "developer" else "system", "content": m.text()} for m in req.messages]
        try:
            prompt = chat_prompt_ids(engine.tokenizer, messages)
        except Exception as exc:  # a chat template that rejects this message order, say
            return error(400, f"could not apply the chat template: {exc}", "invalid_request_error")
        room = context_length - len(prompt)
        wanted = req.max_completion_tokens or req.max_tokens
        if room < 1 or (wanted is not None and wanted > room):
            return error(400, f"{len(prompt)} prompt tokens + {wanted or 1} to generate exceed the model's context "
                         f"of {context_length}", "invalid_request_error", "context_length_exceeded")
        stop = tuple([req.stop] if isinstance(req.stop, str) else (req.stop or []))
        jobs = [_Job(prompt, wanted or min(512, room), req.temperature, req.top_p, stop) for _ in range(req.n)]
        try:
            gens = await asyncio.gather(*(asyncio.wrap_future(engine.submit(j)) for j in jobs))
        except Exception as exc:
            return error(500, f"generation failed: {type(exc).__name__}: {exc}", "server_error")
        choices, completion = [], 0
        for i, g in enumerate(gens):
            text, finish = reply_text(engine.tokenizer, g, stop)
            completion += len(g.token_ids)
            choices.append({"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": finish})
        rid, now = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        usage = {"prompt_tokens": len(prompt), "completion_tokens": completion,
                 "total_tokens": len(prompt) + completion}
        if not req.stream:
            return {"id": rid, "object": "chat.completion", "created": now, "model": model_id,
                    "choices": choices, "usage": usage}

        def events():
            base = {"id": rid, "object": "chat.completion.chunk", "created": now, "model": model_id}
            for c in choices:
                for delta, finish in (({"role": "assistant", "content": c["message"]["content"]}, None),
                                      ({}, c["finish_reason"])):
                    chunk = {**base, "choices": [{"index": c["index"], "delta": delta, "finish_reason": finish}]}
                    yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def resolve_served(model_or_path: str, adapter: str | None) -> tuple[str, str | None]:
    """(base model, adapter folder): a path to an adapter folder serves that adapter on the
    base model recorded in its adapter_config.json."""
    from pathlib import Path

    folder = Path(model_or_path)
    config = folder / "adapter_config.json"
    if adapter is None and config.is_file():
        base = json.loads(config.read_text()).get("base_model_name_or_path")
        if not base:
            raise ValueError(f"{config} names no base_model_name_or_path; pass the base model and --adapter")
        return base, str(folder)
    if adapter is not None and not (Path(adapter) / "adapter_config.json").is_file():
        raise ValueError(f"{adapter} is not a LoRA adapter folder (no adapter_config.json)")
    return model_or_path, adapter


def serve_main(args) -> int:
    """`coa-lab serve` (arguments parsed in coa_lab/cli.py)."""
    import dataclasses
    import ipaddress

    import uvicorn

    from coa_lab.config import get_preset
    from coa_lab.llm import make_generator

    try:
        model_name, adapter = resolve_served(args.model, args.adapter)
    except ValueError as exc:
        raise SystemExit(f"coa-lab serve: {exc}") from None
    preset = get_preset(args.preset)
    preset.model = dataclasses.replace(preset.model, name=model_name, use_unsloth=False)
    preset.gen = dataclasses.replace(preset.gen, backend="hf", batch_size=args.max_batch)
    generator = make_generator(preset, adapter)
    model_id = args.name or args.model  # what clients send as "model"
    if args.api_key_env and not os.environ.get(args.api_key_env):
        raise SystemExit(f"coa-lab serve: --api-key-env {args.api_key_env} is set but the variable is empty")
    try:
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = args.host == "localhost"
    if not loopback and not args.api_key_env:
        print(f"warning: serving on {args.host} without --api-key-env: anyone who can reach it can use the model")
    context = int(getattr(generator.model.config, "max_position_embeddings", 2048))
    app = create_app(BatchingEngine(generator, args.max_batch), model_id, context, args.api_key_env)
    print(f"coa-lab serve: {model_id!r} ({model_name}{' + ' + adapter if adapter else ''}) on "
          f"http://{args.host}:{args.port}/v1", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
