"""The "web_search" (ddgs) and "crawl_page" (httpx) tools, with an offline page store.

Both are optional extras: the lab's default tasks run on the local ``wiki_search``.
What matters for agent training is how they FAIL, because a rollout must go on:

* rate limiting (HTTP 429, ``ddgs.RatelimitException``) is retried with exponential
  backoff (``base_delay_s * 2**attempt``, honouring ``Retry-After`` up to a cap);
* an unreachable network gives an immediate ``[offline] ...`` observation (ok=False)
  instead of a stack trace or a long hang;
* ``CrawlPage`` consults a ``PageStore`` (a dict, or a directory of saved .html files)
  before the network, so tests and offline notebooks replay saved pages;
* ``CrawlPage(summarizer=backend)`` condenses each page towards the goal given after
  ``||`` (see ``page_summary``); a failing backend falls back to the raw text.

No API keys are used here.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from coa_lab.tools.base import Observation, Tool, error_observation
from coa_lab.tools.page_summary import parse_crawl_arg, summarize_pages

# Re-exported: html_to_text / PageStore lived here first and are imported from here.
from coa_lab.tools.page_store import PageStore, html_to_text, normalize_url  # noqa: F401

T = TypeVar("T")
USER_AGENT = "coa-lab/0.1 (teaching lab; +https://arxiv.org/abs/2508.13167)"
_NETWORK_HINTS = ("dns", "connect", "resolve", "unreachable", "name or service",
                  "no route", "network", "timed out", "timeout")


class RateLimited(Exception):
    """Raised inside a retry loop for a 429; carries the server's Retry-After if any."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Offline(Exception):
    """The network (or the host) cannot be reached; becomes an ``[offline]`` observation."""


def with_backoff(fn: Callable[[], T], *, retries: int, base_delay_s: float, max_delay_s: float = 30.0,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """Call ``fn``; on ``RateLimited`` wait ``base_delay_s * 2**attempt`` and retry.

    ``retries`` is the number of RE-tries (so at most ``retries + 1`` calls).  The last
    ``RateLimited`` propagates when retries are exhausted.
    """
    for attempt in range(retries + 1):
        try:
            return fn()
        except RateLimited as exc:
            if attempt == retries:
                raise
            delay = base_delay_s * (2 ** attempt)
            if exc.retry_after_s is not None:
                delay = max(delay, exc.retry_after_s)
            sleep(min(delay, max_delay_s))
    raise AssertionError("unreachable")


def looks_offline(exc: BaseException) -> bool:
    """Heuristic: is this exception a connectivity failure rather than a bad request?"""
    if isinstance(exc, (ConnectionError, socket.gaierror, socket.timeout, TimeoutError)):
        return True
    name = type(exc).__name__
    if name in ("ConnectError", "ConnectTimeout", "ReadTimeout", "PoolTimeout", "TimeoutException",
                "NetworkError", "ProxyError"):
        return True
    text = str(exc).lower()
    return any(h in text for h in _NETWORK_HINTS)


class OfflineMemo:
    """Remembers a connectivity failure for ``ttl_s`` so the next calls fail at once.

    Without it an offline agent pays the full connect timeout on every tool call.
    """

    def __init__(self, ttl_s: float = 30.0) -> None:
        self.ttl_s = ttl_s
        self.until = 0.0

    def mark(self) -> None:
        self.until = time.monotonic() + self.ttl_s

    def check(self) -> None:
        left = self.until - time.monotonic()
        if left > 0:
            raise Offline(f"network was unreachable moments ago; not retrying for {left:.0f}s")


# ----------------------------------------------------------------------------- web_search


class WebSearch(Tool):
    """Web search through the ``ddgs`` metasearch package (no API key)."""

    name = "web_search"
    description = "search the web; argument: a query; returns titles, URLs and snippets"

    def __init__(self, max_results: int = 5, timeout_s: float = 10.0, retries: int = 3,
                 base_delay_s: float = 1.0, max_output_chars: int = 1500,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.max_results, self.timeout_s = max_results, timeout_s
        self.retries, self.base_delay_s, self.sleep = retries, base_delay_s, sleep
        self.max_output_chars = max_output_chars
        self.offline_memo = OfflineMemo()

    def _search_once(self, query: str) -> list[dict[str, Any]]:
        from ddgs import DDGS  # lazy: optional dependency, slow-ish import
        from ddgs.exceptions import DDGSException, RatelimitException, TimeoutException

        self.offline_memo.check()
        try:
            return DDGS(timeout=self.timeout_s).text(query, max_results=self.max_results) or []
        except RatelimitException as exc:
            raise RateLimited(str(exc)) from exc
        except TimeoutException as exc:
            self.offline_memo.mark()
            raise Offline(f"search timed out after {self.timeout_s:g}s") from exc
        except DDGSException as exc:
            if "no results" in str(exc).lower():
                return []
            if looks_offline(exc):
                self.offline_memo.mark()
                raise Offline(str(exc)[:200]) from exc
            raise

    def run(self, arg: str) -> Observation:
        query = " ".join(arg.split())
        if not query:
            return error_observation("empty query")
        try:
            results = with_backoff(lambda: self._search_once(query), retries=self.retries,
                                   base_delay_s=self.base_delay_s, sleep=self.sleep)
        except RateLimited as exc:
            return Observation(text=f"[rate limited] web search refused after {self.retries} retries: {exc}",
                               ok=False, latency_s=0.0, error="rate_limited")
        except Offline as exc:
            return offline_observation("web search", exc)
        except Exception as exc:
            if looks_offline(exc):
                return offline_observation("web search", exc)
            raise
        if not results:
            return Observation(text=f"No web results for {query!r}.", ok=True, latency_s=0.0)
        return Observation(text=format_search_results(results), ok=True, latency_s=0.0)


def format_search_results(results: list[dict[str, Any]]) -> str:
    lines = []
    for i, r in enumerate(results, 1):
        title = " ".join(str(r.get("title", "")).split())
        url = r.get("href") or r.get("url") or ""
        snippet = " ".join(str(r.get("body") or r.get("snippet") or "").split())
        lines.append(f"({i}) {title}\n    {url}\n    {snippet}")
    return "\n".join(lines)


def offline_observation(what: str, exc: BaseException) -> Observation:
    msg = f"{what} unavailable: the network cannot be reached ({type(exc).__name__}: {str(exc)[:200]})"
    return Observation(text=f"[offline] {msg}", ok=False, latency_s=0.0, error="offline")


# ------------------------------------------------------------------------ crawl_page


class CrawlPage(Tool):
    """Fetch pages (``url`` or ``url1 | url2``, optionally ``|| goal: ...``) as readable text.

    With ``summarizer`` (any backend with ``.chat(conversations, max_new_tokens,
    temperature)``), each page is replaced by the backend's goal-directed summary.
    """

    name = "crawl_page"
    description = ("fetch web pages and return their readable text; argument: a URL or 'url1 | url2', "
                   "optionally followed by '|| goal: what to look for'")

    def __init__(self, store: PageStore | Mapping[str, str] | str | os.PathLike[str] | None = None,
                 offline_only: bool = False, timeout_s: float = 10.0, retries: int = 3,
                 base_delay_s: float = 1.0, max_urls: int = 3, max_output_chars: int = 3000,
                 client: Any = None, sleep: Callable[[float], None] = time.sleep,
                 summarizer: Any = None, summary_max_new_tokens: int = 256,
                 summary_input_chars: int = 6000) -> None:
        if store is None or isinstance(store, PageStore):
            self.store = store
        elif isinstance(store, Mapping):
            self.store = PageStore(pages=store)
        else:
            self.store = PageStore(directory=store)
        self.offline_only, self.timeout_s = offline_only, timeout_s
        self.retries, self.base_delay_s, self.sleep = retries, base_delay_s, sleep
        self.max_urls, self.max_output_chars = max_urls, max_output_chars
        self.client = client  # an httpx.Client-like object; tests inject fakes here
        self.offline_memo = OfflineMemo()
        if summarizer is not None and not callable(getattr(summarizer, "chat", None)):
            raise TypeError("summarizer must have .chat(conversations, max_new_tokens, temperature)")
        self.summarizer = summarizer
        self.summary_max_new_tokens, self.summary_input_chars = summary_max_new_tokens, summary_input_chars

    def _fetch_once(self, url: str) -> str:
        import httpx  # lazy: keeps `import coa_lab.tools` light

        self.offline_memo.check()
        get = self.client.get if self.client is not None else httpx.get
        # A short connect timeout: a black-holed network should fail in seconds, not minutes.
        timeout = httpx.Timeout(self.timeout_s, connect=min(3.0, self.timeout_s))
        try:
            resp = get(url, timeout=timeout, follow_redirects=True,
                       headers={"User-Agent": USER_AGENT})
        except httpx.TransportError as exc:
            if looks_offline(exc):
                self.offline_memo.mark()
                raise Offline(str(exc)) from exc
            raise
        if resp.status_code == 429:
            raw = resp.headers.get("Retry-After", "")
            raise RateLimited(f"HTTP 429 from {url}",
                              retry_after_s=float(raw) if raw.strip().isdigit() else None)
        if resp.status_code >= 400:
            raise ValueError(f"HTTP {resp.status_code} for {url}")
        return resp.text

    def fetch_html(self, url: str) -> str:
        """HTML for ``url``: the page store first, then the network (with backoff)."""
        if self.store is not None:
            html = self.store.get(url)
            if html is not None:
                return html
        if self.offline_only:
            raise Offline(f"{url} is not in the offline page store (offline_only=True)")
        return with_backoff(lambda: self._fetch_once(url), retries=self.retries,
                            base_delay_s=self.base_delay_s, sleep=self.sleep)

    def run(self, arg: str) -> Observation:
        urls, goal = parse_crawl_arg(arg)
        if not urls:
            return error_observation("no URL given; pass 'https://...' or 'url1 | url2 || goal: ...'")
        bad = [u for u in urls if not re.match(r"^https?://", u)]
        if bad:
            return error_observation(f"not an http(s) URL: {bad[0]!r}")
        urls = urls[: self.max_urls]
        budget = max(200, self.max_output_chars // len(urls) - 100)
        pages: dict[str, tuple[str, str]] = {}  # url -> (title, text) of pages fetched fine
        failures: dict[str, str] = {}
        all_ok, offline = True, 0
        for url in urls:
            try:
                pages[url] = html_to_text(self.fetch_html(url))
            except Offline as exc:
                all_ok, offline = False, offline + 1
                failures[url] = f"[offline] cannot reach it: {str(exc)[:200]}"
            except RateLimited as exc:
                all_ok = False
                failures[url] = f"[rate limited] gave up after {self.retries} retries: {exc}"
            except Exception as exc:  # one bad URL must not hide the others
                all_ok = False
                failures[url] = f"[error] {type(exc).__name__}: {str(exc)[:200]}"
        summaries = self._summaries(goal, pages)
        sections = []
        for url in urls:
            if url in failures:
                sections.append(f"[{url}] {failures[url]}")
                continue
            title, text = pages[url]
            summary = summaries.get(url)
            if isinstance(summary, str) and not summary.startswith("[summary unavailable"):
                body = "[summary" + (f" for goal: {goal}" if goal else "") + "]\n" + _clip(summary, budget)
            else:
                note = (summary + "\n") if summary else ""
                body = note + (_clip(text, budget) or "(no readable text)")
            sections.append(f"[{url}] {title}\n{body}")
        text = "\n\n".join(sections)
        if offline == len(urls):
            text = "[offline] crawl_page could not reach any page (network unreachable)\n" + text
        error = None if all_ok else ("offline" if offline == len(urls) else "partial failure")
        return Observation(text=text, ok=all_ok, latency_s=0.0, error=error)

    def _summaries(self, goal: str | None, pages: dict[str, tuple[str, str]]) -> dict[str, str]:
        """url -> summary, or -> a "[summary unavailable: ...]" note; {} without a summarizer."""
        if self.summarizer is None or not pages:
            return {}
        todo = [(u, t, x) for u, (t, x) in pages.items() if x.strip()]
        result = summarize_pages(self.summarizer, goal, todo, max_input_chars=self.summary_input_chars,
                                 max_new_tokens=self.summary_max_new_tokens)
        if isinstance(result, str):
            return {u: f"[summary unavailable: {result}; raw page text follows]" for u, _, _ in todo}
        return {u: (s if s is not None else "[summary unavailable: empty reply; raw page text follows]")
                for (u, _, _), s in zip(todo, result)}


def _clip(text: str, budget: int) -> str:
    if len(text) > budget:
        return text[:budget].rsplit(" ", 1)[0] + " ...[page truncated]"
    return text
