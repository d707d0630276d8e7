"""What every client of a remote model server needs: one pooled HTTP client shared by threads,
a retry schedule, and keys kept out of messages. Shared by the OpenAI-compatible teacher
backend (coa_lab/generation/openai_backend.py) and the vLLM server sampler
(coa_lab/generation/vllm_server.py)."""

from __future__ import annotations

import os
import random
import time

# worth retrying: rate limits, overloaded or restarting servers, gateway timeouts
RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class BackendError(RuntimeError):
    """A request that failed for good (after retries, or not retryable)."""


class AuthError(BackendError):
    """The endpoint rejected the key: every later request would fail the same way."""


class PooledHTTP:
    """A mixin: `_http()` (one httpx client per object, created lazily), `close()`, `_scrub()`
    `_delay()` and `_pause_before_retry()`. The class sets `concurrency`, `timeout_s`,
    `api_key_env`, `max_retries`, `backoff_s`, `max_backoff_s`, `retries` (a counter), `_lock`
    (a threading.Lock) and `_client = None` in its constructor."""

    def _http(self):
        import httpx

        with self._lock:
            if self._client is None:  # one pooled client, shared by every thread
                limits = httpx.Limits(max_connections=self.concurrency * 2, max_keepalive_connections=self.concurrency)
                # a dead host should fail fast; a long generation may legitimately take minutes
                timeout = httpx.Timeout(self.timeout_s, connect=min(10.0, self.timeout_s))
                self._client = httpx.Client(timeout=timeout, limits=limits)
            return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def _scrub(self, text: str) -> str:
        """`text` with the key (read from the environment now) replaced: error messages echo URLs and bodies."""
        key = os.environ.get(self.api_key_env)
        return text.replace(key, "***") if key else text

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        """Seconds before retry `attempt`: the server's Retry-After if it sent seconds, else
        exponential backoff with jitter (so many clients do not retry in lockstep), capped."""
        if retry_after:
            try:
                return min(self.max_backoff_s, max(0.0, float(retry_after)))
            except ValueError:
                pass  # an HTTP date: fall back to our own schedule
        return min(self.max_backoff_s, self.backoff_s * 2**attempt * random.uniform(0.5, 1.5))

    def _pause_before_retry(self, attempt: int, retry_after: str | None) -> bool:
        """Sleep before retry `attempt + 1` and count it; False when the retries are used up."""
        if attempt >= self.max_retries:
            return False
        with self._lock:
            self.retries += 1
        time.sleep(self._delay(attempt, retry_after))
        return True
