"""The "web_search" (ddgs) and "crawl_page" (httpx) tools, with an offline page store.

Both are optional extras: the lab's default tasks run on the local ``wiki_search``.
What matters for agent training is how they FAIL, because a rollout must go on:

* rate limiting (HTTP 429, ``ddgs.RatelimitException``) is retried with exponential
  backoff (``base_delay_s * 2**attempt``, honouring ``Retry-After`` up to a cap);
* an unreachable network gives an immediate ``[offline] ...`` observation (ok=False)
  instead of a stack trace or a long hang;
* ``CrawlPage`` consults a ``PageStore`` (a dict, or a directory of saved .html files)
  before the network, so tests and offline notebooks replay saved pages.

No API keys are used here.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import time
from collections.abc import Callable, Mapping
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urldefrag

from coa_lab.tools.base import Observation, Tool, error_observation

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


# --------------------------------------------------------------------- text extraction

_SKIP_TAGS = {"script", "style", "noscript", "nav", "header", "footer", "aside", "form",
              "svg", "template", "iframe", "button", "select"}
_BLOCK_TAGS = {"p", "div", "br", "li", "ul", "ol", "tr", "table", "section", "article",
               "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "pre", "dd", "dt", "main"}
_VOID_TAGS = {"br", "img", "hr", "meta", "link", "input", "area", "base", "col", "embed",
              "source", "track", "wbr"}


class _TextExtractor(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title_parts: list[str] = []
        self.skip_depth = 0
        self.in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIP_TAGS:
            self.skip_depth += 1
        elif tag == "title":
            self.in_title = True
        if tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _BLOCK_TAGS:
            self.parts.append("\n")  # <br/> must not open a skip region

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP_TAGS and self.skip_depth > 0:
            self.skip_depth -= 1
        elif tag == "title":
            self.in_title = False
        if tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self.in_title:
            self.title_parts.append(data)
        elif self.skip_depth == 0:
            # Source newlines are layout, not structure: only block tags break lines.
            self.parts.append(re.sub(r"\s+", " ", data))


def html_to_text(html: str) -> tuple[str, str]:
    """Readable text of an HTML page: ``(title, text)``.

    Drops script/style/nav/header/footer/forms, keeps paragraph breaks as single
    newlines and collapses all other whitespace.
    """
    parser = _TextExtractor()
    try:
        parser.feed(html)
        parser.close()
    except Exception:  # malformed HTML: keep what was parsed so far
        pass
    title = " ".join("".join(parser.title_parts).split())
    raw = "".join(parser.parts)
    lines = (" ".join(line.split()) for line in raw.split("\n"))
    text = "\n".join(line for line in lines if line)
    return title, text


# ------------------------------------------------------------------------ page store


def normalize_url(url: str) -> str:
    url = urldefrag(url.strip())[0]
    return url[:-1] if url.endswith("/") and url.count("/") > 3 else url


class PageStore:
    """Saved pages keyed by URL: an in-memory dict and/or a directory.

    The directory holds ``<sha1(url)[:16]>.html`` files plus ``index.json`` mapping URL
    -> file name (the index is what makes a hand-saved page findable under its URL).
    """

    def __init__(self, pages: Mapping[str, str] | None = None,
                 directory: str | os.PathLike[str] | None = None) -> None:
        self.pages = {normalize_url(u): h for u, h in (pages or {}).items()}
        self.directory = Path(directory) if directory is not None else None

    @staticmethod
    def filename(url: str) -> str:
        return hashlib.sha1(normalize_url(url).encode()).hexdigest()[:16] + ".html"

    def _index(self) -> dict[str, str]:
        assert self.directory is not None
        path = self.directory / "index.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}

    def get(self, url: str) -> str | None:
        key = normalize_url(url)
        if key in self.pages:
            return self.pages[key]
        if self.directory is None:
            return None
        index = {normalize_url(u): f for u, f in self._index().items()}
        path = self.directory / index.get(key, self.filename(key))
        return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None

    def put(self, url: str, html: str) -> None:
        key = normalize_url(url)
        if self.directory is None:
            self.pages[key] = html
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        name = self.filename(key)
        (self.directory / name).write_text(html, encoding="utf-8")
        index = self._index()
        index[key] = name
        (self.directory / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True), encoding="utf-8")

    def __contains__(self, url: str) -> bool:
        return self.get(url) is not None


# ------------------------------------------------------------------------ crawl_page


class CrawlPage(Tool):
    """Fetch pages (``url`` or ``url1 | url2``) and return their readable text."""

    name = "crawl_page"
    description = "fetch web pages and return their readable text; argument: a URL or 'url1 | url2'"

    def __init__(self, store: PageStore | Mapping[str, str] | str | os.PathLike[str] | None = None,
                 offline_only: bool = False, timeout_s: float = 10.0, retries: int = 3,
                 base_delay_s: float = 1.0, max_urls: int = 3, max_output_chars: int = 3000,
                 client: Any = None, sleep: Callable[[float], None] = time.sleep) -> None:
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
        urls = [u.strip() for u in re.split(r"[|\s]+", arg) if u.strip()]
        if not urls:
            return error_observation("no URL given; pass 'https://...' or 'url1 | url2'")
        bad = [u for u in urls if not re.match(r"^https?://", u)]
        if bad:
            return error_observation(f"not an http(s) URL: {bad[0]!r}")
        urls = urls[: self.max_urls]
        budget = max(200, self.max_output_chars // len(urls) - 100)
        sections, all_ok, offline = [], True, 0
        for url in urls:
            try:
                title, text = html_to_text(self.fetch_html(url))
                if len(text) > budget:
                    text = text[:budget].rsplit(" ", 1)[0] + " ...[page truncated]"
                sections.append(f"[{url}] {title}\n{text or '(no readable text)'}")
            except Offline as exc:
                all_ok, offline = False, offline + 1
                sections.append(f"[{url}] [offline] cannot reach it: {str(exc)[:200]}")
            except RateLimited as exc:
                all_ok = False
                sections.append(f"[{url}] [rate limited] gave up after {self.retries} retries: {exc}")
            except Exception as exc:  # one bad URL must not hide the others
                all_ok = False
                sections.append(f"[{url}] [error] {type(exc).__name__}: {str(exc)[:200]}")
        text = "\n\n".join(sections)
        if offline == len(urls):
            text = "[offline] crawl_page could not reach any page (network unreachable)\n" + text
        error = None if all_ok else ("offline" if offline == len(urls) else "partial failure")
        return Observation(text=text, ok=all_ok, latency_s=0.0, error=error)
