"""`coa-lab serve`: a lab model behind an OpenAI-compatible HTTP API, on loopback.

    coa-lab serve embedded:smollm2-135m-instruct --port 8000
    coa-lab serve runs/demo/sft/adapter              # a trained adapter (its base is read from it)
    coa-lab serve Qwen/Qwen2.5-3B-Instruct --adapter runs/x/rl/adapter --name my-student

Then anything that speaks the OpenAI chat API can use it: the lab's own capture as a teacher
(`--set capture.teacher_url=http://127.0.0.1:8000/v1 --set capture.teacher_model=<id>`),
an LLM judge, or an outside evaluation harness.

    GET  /v1/models              the model served, under its id (+ max_model_len), and each
                                 LoRA adapter loaded at runtime (its `parent` is the model)
    POST /v1/chat/completions    messages, max_tokens, temperature, top_p, n, stop, stream
    POST /v1/completions         prompt as text, token ids or a list of either; n, max_tokens,
                                 temperature, top_p, stop, include_stop_str_in_output,
                                 skip_special_tokens, return_token_ids (vLLM's field names)
    POST /v1/load_lora_adapter   {"lora_name", "lora_path"}: a PEFT LoRA folder, then served
    POST /v1/unload_lora_adapter {"lora_name"}          under its name as a request's `model`
    GET  /health

The completion and LoRA endpoints are a CPU stand-in for the subset of vLLM's OpenAI server
that coa_lab.generation.vllm_server.VLLMServerGenerator uses (RL sampling from a separate `vllm serve` with LoRA
hot loading, docs/vllm-server.md): same request fields, same response fields (`token_ids`,
`stop_reason`), same success strings and 404s. As in vLLM, the LoRA endpoints exist only when
VLLM_ALLOW_RUNTIME_LORA_UPDATING=True is set in the server's environment (they make the server
read a folder a client names).

Requests that arrive together are decoded together: a worker thread takes everything queued
(up to `max_batch` rows, same sampling settings and same adapter) and runs ONE batched
generate, so eight concurrent clients cost about as much as one batch, not eight sequential
replies. Adapters are loaded, switched and removed on that same thread, between batches (the
model is not thread-safe). The endpoints are async and only wait on that worker, so the server
keeps accepting while it decodes. `stream: true` is answered in server-sent-event form, but
with the whole reply in one chunk (the batch decodes all rows before any is returned).

Built on FastAPI + uvicorn. Bound to 127.0.0.1 by default; `--api-key-env VAR` makes it
require `Authorization: Bearer $VAR` (the key is read from the environment, never printed).
"""


from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from pathlib import Path

from coa_lab.generation.chat_prompt import chat_prompt_ids
from coa_lab.serve.adapters import AdapterAlreadyLoaded
from coa_lab.serve.batching import BatchingEngine, Job
# module level: FastAPI resolves the endpoints' annotations in this module's namespace
from coa_lab.serve.schema import (ChatRequest, CompletionRequest, LoadLoRAAdapterRequest,
                                             UnloadLoRAAdapterRequest, completion_choice, completion_logprobs,
                                             reply_text)


def runtime_lora_allowed() -> bool:
    """vLLM's switch for the LoRA endpoints (vllm/envs.py reads it the same way)."""
    return os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0").strip().lower() in ("1", "true")


def create_app(engine: BatchingEngine, model_id: str, context_length: int, api_key_env: str | None = None,
               runtime_lora: bool | None = None):
    """The FastAPI app serving `engine` as `model_id`. runtime_lora: whether the LoRA load /
    unload endpoints exist (None: VLLM_ALLOW_RUNTIME_LORA_UPDATING decides, as in vLLM)."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

    app = FastAPI(title="coa-lab serve", version="1")
    created = int(time.time())
    runtime_lora = runtime_lora_allowed() if runtime_lora is None else runtime_lora
    adapters = engine.adapters

    def error(status: int, message: str, kind: str, code: str | None = None) -> JSONResponse:
        return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": code}})

    def vllm_error(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
        """vLLM's ErrorResponse shape (vllm/entrypoints/openai/engine/protocol.py)."""
        return JSONResponse(status_code=status,
                            content={"error": {"message": message, "type": kind, "param": param, "code": status}})

    def served(name: str | None) -> tuple[bool, str | None]:
        """(known, adapter): the served model itself (adapter None) or a loaded LoRA."""
        if name is None or name == model_id:
            return True, None
        if name in adapters.paths:
            return True, name
        return False, None

    def vocab_size() -> int:
        config = getattr(getattr(engine.generator, "model", None), "config", None)
        return int(getattr(config, "vocab_size", 0) or len(engine.tokenizer))

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
        return {"status": "ok", "model": model_id, "batches": engine.batches, "adapters": sorted(adapters.paths)}

    @app.get("/v1/models")
    async def models():
        cards = [{"id": model_id, "object": "model", "created": created, "owned_by": "coa-lab", "root": model_id,
                  "parent": None, "max_model_len": context_length}]
        cards += [{"id": name, "object": "model", "created": created, "owned_by": "coa-lab", "root": path,
                   "parent": model_id, "max_model_len": None} for name, path in list(adapters.paths.items())]
        return {"object": "list", "data": cards}

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest):
        known, adapter = served(req.model)
        if not known:
            return error(404, f"model {req.model!r} is not served here; this server serves {model_id!r}"
                         + (f" and the LoRA adapters {sorted(adapters.paths)}" if adapters.paths else ""),
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
        jobs = [Job(prompt, wanted or min(512, room), req.temperature, req.top_p, stop, adapter) for _ in range(req.n)]
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

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest):
        known, adapter = served(req.model)
        if not known:  # vLLM's answer (OpenAIServingModels.check_model)
            return vllm_error(404, f"The model `{req.model}` does not exist.", "NotFoundError", "model")
        unsupported = req.unsupported()
        if unsupported:
            return vllm_error(400, f"{unsupported} is not supported by coa-lab serve", "BadRequestError")
        if isinstance(req.prompt, str):
            texts_or_ids = [req.prompt]
        elif req.prompt and isinstance(req.prompt[0], int):
            texts_or_ids = [req.prompt]
        else:
            texts_or_ids = list(req.prompt)
        if not texts_or_ids:
            return vllm_error(400, "Either prompt or prompt_embeds must be provided and non-empty.", "BadRequestError",
                              "prompt")
        prompts: list[list[int]] = []
        for p in texts_or_ids:
            ids = (engine.tokenizer(p, add_special_tokens=req.add_special_tokens)["input_ids"] if isinstance(p, str)
                   else list(p))
            if not ids:
                return vllm_error(400, "Either prompt or prompt_embeds must be provided and non-empty.",
                                  "BadRequestError", "prompt")
            prompts.append(ids)
        vocab = vocab_size()
        bad = next((t for p in prompts for t in p if not 0 <= t < vocab), None)
        if bad is not None:
            return vllm_error(400, f"Token id {bad} is out of vocabulary (size {vocab})", "BadRequestError", "prompt")
        max_tokens = req.max_tokens or 16
        for p in prompts:
            if len(p) + max_tokens > context_length:
                return vllm_error(400, f"This model's maximum context length is {context_length} tokens. However, you "
                                  f"requested {len(p) + max_tokens} tokens ({len(p)} in the messages, {max_tokens} in "
                                  f"the completion). Please reduce the length of the messages or completion.",
                                  "BadRequestError", "max_tokens")
        stop = tuple([req.stop] if isinstance(req.stop, str) else (req.stop or []))
        temperature = 1.0 if req.temperature is None else req.temperature
        top_p = 1.0 if req.top_p is None else req.top_p
        jobs = [Job(p, max_tokens, temperature, top_p, stop, adapter) for p in prompts for _ in range(req.n)]
        try:
            gens = await asyncio.gather(*(asyncio.wrap_future(engine.submit(j)) for j in jobs))
        except Exception as exc:
            return vllm_error(500, f"generation failed: {type(exc).__name__}: {exc}", "InternalServerError")
        choices = []
        for i, g in enumerate(gens):  # prompt-major: choice i*n + j is prompt i's j-th sample, as in vLLM
            c = {"index": i, **completion_choice(engine.tokenizer, g, stop, req.include_stop_str_in_output,
                                                 req.skip_special_tokens)}
            if req.logprobs is not None:
                c["logprobs"] = completion_logprobs(engine.tokenizer, g)
            c["prompt_token_ids"] = prompts[i // req.n] if req.return_token_ids else None
            if not req.return_token_ids:
                c["token_ids"] = None
            choices.append(c)
        prompt_tokens = sum(len(p) for p in prompts)
        completion_tokens = sum(len(g.token_ids) for g in gens)
        body = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": req.model or model_id, "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}}
        if not req.stream:
            return body

        def events():
            for c in choices:
                yield f"data: {json.dumps({**body, 'choices': [c], 'usage': None})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    if runtime_lora:  # vLLM registers these only with VLLM_ALLOW_RUNTIME_LORA_UPDATING

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


def _check_port(host: str, port: int) -> None:
    """Fail in one line, before the model loads, when the address cannot be listened on."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise SystemExit(f"coa-lab serve: cannot listen on {host}:{port} ({exc.strerror or exc}); "
                             f"another server is there? pass --port with a free port") from None


def serve_main(args) -> int:
    """`coa-lab serve` (arguments parsed in coa_lab/cli.py)."""
    import dataclasses
    import ipaddress

    import uvicorn

    from coa_lab.config import get_preset
    from coa_lab.generation.llm import make_generator

    try:
        model_name, adapter = resolve_served(args.model, args.adapter)
    except ValueError as exc:
        raise SystemExit(f"coa-lab serve: {exc}") from None
    preset = get_preset(args.preset)
    preset.model = dataclasses.replace(preset.model, name=model_name, use_unsloth=False)
    preset.gen = dataclasses.replace(preset.gen, backend="hf", batch_size=args.max_batch)
    # the mistakes that need no model are caught before it loads
    if args.api_key_env and not os.environ.get(args.api_key_env):
        raise SystemExit(f"coa-lab serve: --api-key-env {args.api_key_env} is set but the variable is empty")
    _check_port(args.host, args.port)
    generator = make_generator(preset, adapter)
    model_id = args.name or args.model  # what clients send as "model"
    try:
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = args.host == "localhost"
    if not loopback and not args.api_key_env:
        print(f"warning: serving on {args.host} without --api-key-env: anyone who can reach it can use the model")
    context = int(getattr(generator.model.config, "max_position_embeddings", 2048))
    runtime_lora = runtime_lora_allowed()
    app = create_app(BatchingEngine(generator, args.max_batch), model_id, context, args.api_key_env, runtime_lora)
    print(f"coa-lab serve: {model_id!r} ({model_name}{' + ' + adapter if adapter else ''}) on "
          f"http://{args.host}:{args.port}/v1", flush=True)
    if runtime_lora:
        print("coa-lab serve: runtime LoRA loading is on (VLLM_ALLOW_RUNTIME_LORA_UPDATING): clients can make this "
              "server read adapter folders by path", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
