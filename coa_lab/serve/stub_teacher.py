"""A stand-in remote teacher: an OpenAI-compatible server that answers each of the teacher's
agents with a fixed, well-formed reply after a delay, and fails a share of requests with 429
or 500 the way a busy hosted API does.

It exists to measure and test the capture driver's concurrency and retries without a real
API (benchmarks/bench_capture.py, tests/capture/test_capture.py) and to let a learner watch retries
happen (notebook 01_capture). It knows nothing: its answers are placeholders, not solutions.

    app = stub_app(delay_s=0.2, fail_rate=0.2, seed=0)   # run with uvicorn, or:
    with serve_in_thread(app) as base_url: ...           # http://127.0.0.1:<free port>/v1
"""

# No `from __future__ import annotations` here: FastAPI reads the endpoint's `Request`
# annotation at runtime, and a string annotation of a locally imported name does not resolve.
import asyncio
import contextlib
import random
import socket
import threading
import time

from coa_lab import prompts

# Each agent's reply, by its system prompt (capture/teacher.py builds the conversations).
REPLIES = {
    prompts.PLANNER: "1. Compute the value with code. 2. Report it.",
    prompts.THINKER: "Compute the value with a short program.",
    prompts.CODER: "```python\nprint(6 * 7)\n```",
    prompts.SEARCHER: "capital of France",
    prompts.REFLECTOR: "The result answers the question.",
    prompts.ANSWERER: "42",
}


def stub_app(delay_s: float = 0.2, fail_rate: float = 0.0, seed: int = 0, model_id: str = "stub-teacher"):
    """FastAPI app: /v1/models and /v1/chat/completions. Each request sleeps `delay_s`
    (asynchronously: requests in flight overlap, as on a real server), then fails with 429
    (with Retry-After: 0) or 500 with probability `fail_rate`, else answers. `app.state.stats`
    counts requests, failures and the most requests ever in flight at once."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    app = FastAPI(title="coa-lab stub teacher")
    rng = random.Random(seed)
    stats = {"requests": 0, "failed": 0, "in_flight": 0, "max_in_flight": 0}
    app.state.stats = stats

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_id, "object": "model", "owned_by": "stub"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        stats["requests"] += 1
        stats["in_flight"] += 1
        stats["max_in_flight"] = max(stats["max_in_flight"], stats["in_flight"])
        try:
            await asyncio.sleep(delay_s)
        finally:
            stats["in_flight"] -= 1
        roll = rng.random()
        if roll < fail_rate:
            stats["failed"] += 1
            if roll < fail_rate / 2:
                return JSONResponse(status_code=429, headers={"Retry-After": "0"},
                                    content={"error": {"message": "rate limited", "type": "rate_limit"}})
            return JSONResponse(status_code=500, content={"error": {"message": "overloaded", "type": "server_error"}})
        system = body["messages"][0]["content"] if body.get("messages") else ""
        text = REPLIES.get(system, "OK.")
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        return {"id": "stub", "object": "chat.completion", "created": int(time.time()), "model": model_id,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(text.split())}}

    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_in_thread(app, port: int | None = None):
    """Run an ASGI app with uvicorn on a loopback port in a background thread; yields the
    OpenAI base URL and stops the server on exit."""
    import uvicorn

    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the server did not start on port {port}")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
