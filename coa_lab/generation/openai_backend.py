"""Any OpenAI-compatible chat endpoint (a hosted API, `vllm serve`, Ollama, `coa-lab serve`)
as a teacher or judge, with the same `.chat(conversations, max_new_tokens)` as HFGenerator.

What a remote teacher needs that a local model does not:
- **concurrency**: a local model batches; a server is fed by many requests in flight. `chat`
  sends its conversations through a bounded thread pool (`concurrency` at a time), and the
  capture driver (capture/recorder.py) runs whole teacher runs side by side on the same client.
- **retries**: rate limits (429) and overloaded servers (5xx, timeouts, dropped connections)
  are normal at scale; they are retried with exponential backoff and jitter, honouring the
  server's Retry-After. What retrying cannot fix (400, 404) raises `BackendError` for the
  caller to record; a rejected key (401/403) raises `AuthError`, which stops a capture at once
  instead of recording thousands of failed runs.
- **secrets**: the key is read from the environment variable named by `api_key_env` at call
  time, never stored on the object, and scrubbed from every error message.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx

from coa_lab.generation.http_client import RETRY_STATUS, AuthError, BackendError, PooledHTTP  # noqa: F401 (re-exported)
from coa_lab.generation.result import Generation

class OpenAIChatBackend(PooledHTTP):
    """Chat completions from `base_url` (e.g. http://127.0.0.1:8000/v1) for `model`.

    concurrency: requests in flight at once; max_retries / backoff_s / max_backoff_s: the retry
    policy (delay = backoff_s * 2**attempt, times a random 0.5-1.5, capped; or Retry-After).
    Counters (`requests`, `retries`) are kept for the capture's cost summary.
    """

    concurrent = True  # the capture driver runs independent teacher runs side by side

    def __init__(self, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY", timeout_s: float = 60.0,
                 concurrency: int = 8, max_retries: int = 6, backoff_s: float = 0.5, max_backoff_s: float = 30.0):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.concurrency = max(1, concurrency)
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.requests = 0
        self.retries = 0
        self._lock = threading.Lock()
        self._client = None

    def __repr__(self) -> str:  # no secrets in notebooks' reprs
        return f"OpenAIChatBackend(base_url={self.base_url!r}, model={self.model!r}, concurrency={self.concurrency})"

    def complete(self, messages: list[dict], max_new_tokens: int, temperature: float = 0.0) -> Generation:
        """One conversation -> one reply, retried on 429/5xx/timeouts."""
        headers = {}
        key = os.environ.get(self.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        body = {"model": self.model, "messages": messages, "max_tokens": max_new_tokens, "temperature": temperature}
        url = f"{self.base_url}/chat/completions"
        for attempt in range(self.max_retries + 1):
            with self._lock:
                self.requests += 1
            retry_after = None
            try:
                resp = self._http().post(url, headers=headers, json=body)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if resp.status_code == 200:
                    try:
                        return _parse(resp.json())
                    except ValueError:  # not JSON at all (a proxy's HTML page, say)
                        raise BackendError(self._scrub(f"teacher endpoint {self.base_url} answered 200 with a body "
                                                       f"that is not JSON: {resp.text[:200]!r}")) from None
                problem = f"HTTP {resp.status_code}: {resp.text[:200]}"
                if resp.status_code in (401, 403):
                    raise AuthError(self._scrub(f"teacher endpoint {self.base_url} rejected the key "
                                                f"(${self.api_key_env}): {problem}"))
                if resp.status_code not in RETRY_STATUS:
                    raise BackendError(self._scrub(f"teacher endpoint {self.base_url} answered {problem}"))
                retry_after = resp.headers.get("retry-after")
            if not self._pause_before_retry(attempt, retry_after):
                break
        raise BackendError(self._scrub(f"teacher endpoint {self.base_url} failed {self.max_retries + 1} times; "
                                       f"last: {problem}"))

    def chat(self, conversations: list[list[dict]], max_new_tokens: int, temperature: float = 0.0) -> list[Generation]:
        """One reply per conversation, `concurrency` requests in flight; raises the first
        error (the capture driver sends one conversation per call and records errors per run)."""
        if len(conversations) <= 1:
            return [self.complete(m, max_new_tokens, temperature) for m in conversations]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(conversations))) as pool:
            return list(pool.map(lambda m: self.complete(m, max_new_tokens, temperature), conversations))


def _parse(body: dict) -> Generation:
    try:
        choice = body["choices"][0]
        text = choice["message"].get("content") or ""
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise BackendError(f"not a chat completion response ({type(exc).__name__}: {exc}): {str(body)[:200]}") from None
    usage = body.get("usage") or {}
    finish = "eos" if choice.get("finish_reason") == "stop" else "length"
    return Generation([], text.strip(), finish, int(usage.get("prompt_tokens") or 0),
                      int(usage.get("completion_tokens") or 0))
