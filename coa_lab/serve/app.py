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

Built on FastAPI + uvicorn (the endpoints: routes.py). Bound to 127.0.0.1 by default;
`--api-key-env VAR` makes it require `Authorization: Bearer $VAR` (the key is read from the
environment, never printed).
"""


from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import socket
from pathlib import Path

# fastapi at the top: this module is the server, imported only by `coa-lab serve` and its tests
from fastapi import FastAPI

from coa_lab.config import get_preset
from coa_lab.generation.llm import make_generator
from coa_lab.serve.batching import BatchingEngine
from coa_lab.serve.routes import (Served, add_chat_route, add_completion_route, add_errors_and_auth, add_lora_routes,
                                  add_model_routes)


def runtime_lora_allowed() -> bool:
    """vLLM's switch for the LoRA endpoints (vllm/envs.py reads it the same way)."""
    return os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0").strip().lower() in ("1", "true")


def create_app(engine: BatchingEngine, model_id: str, context_length: int, api_key_env: str | None = None,
               runtime_lora: bool | None = None):
    """The FastAPI app serving `engine` as `model_id`. runtime_lora: whether the LoRA load /
    unload endpoints exist (None: VLLM_ALLOW_RUNTIME_LORA_UPDATING decides, as in vLLM)."""
    app = FastAPI(title="coa-lab serve", version="1")
    served = Served(engine, model_id, context_length)
    add_errors_and_auth(app, api_key_env)
    add_model_routes(app, served)
    add_chat_route(app, served)
    add_completion_route(app, served)
    if runtime_lora_allowed() if runtime_lora is None else runtime_lora:
        add_lora_routes(app, served)  # vLLM registers these only with VLLM_ALLOW_RUNTIME_LORA_UPDATING
    return app


def resolve_served(model_or_path: str, adapter: str | None) -> tuple[str, str | None]:
    """(base model, adapter folder): a path to an adapter folder serves that adapter on the
    base model recorded in its adapter_config.json."""
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
    import uvicorn  # late: only a served port needs it; create_app's callers (the tests) do not

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
