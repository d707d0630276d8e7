"""web_search / crawl_page failure paths, HTML extraction and the offline page store.

No test touches the network: DDGS and httpx are replaced by fakes.
"""

from __future__ import annotations

import sys
import types

import httpx
import pytest

from coa_lab.tools.web import CrawlPage, PageStore, RateLimited, WebSearch, html_to_text, with_backoff

PAGE = """<!doctype html><html><head><title> Example  Page </title>
<style>body { color: red }</style><script>var secret = "js";</script></head>
<body><nav><a href="/">Home</a> | <a href="/about">About</a></nav>
<header>Site header</header>
<main><h1>Heading</h1><p>First   paragraph
with   <b>bold</b> text &amp; an entity.</p><p>Second<br/>line</p>
<ul><li>one</li><li>two</li></ul></main>
<footer>Copyright footer</footer><noscript>enable js</noscript></body></html>"""


def test_html_to_text_strips_boilerplate() -> None:
    title, text = html_to_text(PAGE)
    assert title == "Example Page"
    assert "First paragraph with bold text & an entity." in text
    assert "Second\nline" in text and "one\ntwo" in text
    for junk in ("secret", "color: red", "Home", "Site header", "Copyright", "enable js"):
        assert junk not in text
    assert "  " not in text


def test_html_to_text_malformed() -> None:
    title, text = html_to_text("<p>unclosed <div>text <script>x")
    assert "unclosed" in text and "text" in text and "x" not in text.split()


# ---------------------------------------------------------------- backoff


def test_with_backoff_exponential_delays() -> None:
    sleeps: list[float] = []
    calls = {"n": 0}

    def flaky() -> str:
        calls["n"] += 1
        if calls["n"] < 4:
            raise RateLimited("429")
        return "ok"

    assert with_backoff(flaky, retries=5, base_delay_s=0.5, sleep=sleeps.append) == "ok"
    assert sleeps == [0.5, 1.0, 2.0]


def test_with_backoff_gives_up() -> None:
    sleeps: list[float] = []
    with pytest.raises(RateLimited):
        with_backoff(lambda: (_ for _ in ()).throw(RateLimited("429")), retries=2,
                     base_delay_s=1.0, sleep=sleeps.append)
    assert sleeps == [1.0, 2.0]


# ---------------------------------------------------------------- web_search


def install_fake_ddgs(monkeypatch, behaviour) -> dict:
    """Replace the ddgs package with a fake whose DDGS().text() runs ``behaviour``."""
    from ddgs import exceptions as real_exc

    state = {"calls": 0}

    class FakeDDGS:
        def __init__(self, timeout=None):
            self.timeout = timeout

        def text(self, query, max_results=5):
            state["calls"] += 1
            return behaviour(state["calls"], query)

    fake = types.ModuleType("ddgs")
    fake.DDGS = FakeDDGS
    fake.exceptions = real_exc
    monkeypatch.setitem(sys.modules, "ddgs", fake)
    monkeypatch.setitem(sys.modules, "ddgs.exceptions", real_exc)
    return state


def test_web_search_formats_results(monkeypatch) -> None:
    install_fake_ddgs(monkeypatch, lambda n, q: [
        {"title": "Python", "href": "https://python.org", "body": "The  language."},
        {"title": "PyPI", "href": "https://pypi.org", "body": "Packages."}])
    obs = WebSearch()("python")
    assert obs.ok
    assert obs.text.splitlines()[:3] == ["(1) Python", "    https://python.org", "    The language."]
    assert "(2) PyPI" in obs.text


def test_web_search_retries_rate_limit_then_succeeds(monkeypatch) -> None:
    from ddgs.exceptions import RatelimitException

    def behaviour(n, q):
        if n <= 2:
            raise RatelimitException("202 Ratelimit")
        return [{"title": "T", "href": "u", "body": "b"}]

    state = install_fake_ddgs(monkeypatch, behaviour)
    sleeps: list[float] = []
    obs = WebSearch(base_delay_s=0.25, sleep=sleeps.append)("q")
    assert obs.ok and state["calls"] == 3 and sleeps == [0.25, 0.5]


def test_web_search_rate_limit_exhausted(monkeypatch) -> None:
    from ddgs.exceptions import RatelimitException

    def always(n, q):
        raise RatelimitException("ratelimit")

    state = install_fake_ddgs(monkeypatch, always)
    sleeps: list[float] = []
    obs = WebSearch(retries=3, base_delay_s=1, sleep=sleeps.append)("q")
    assert not obs.ok and obs.text.startswith("[rate limited]") and obs.error == "rate_limited"
    assert state["calls"] == 4 and sleeps == [1, 2, 4]


def test_web_search_offline_fails_fast(monkeypatch) -> None:
    from ddgs.exceptions import DDGSException

    def dns_fail(n, q):
        raise DDGSException("DNSError: error resolving DNS for search.example")

    state = install_fake_ddgs(monkeypatch, dns_fail)
    sleeps: list[float] = []
    tool = WebSearch(sleep=sleeps.append)
    obs = tool("q")
    assert not obs.ok and obs.text.startswith("[offline]") and obs.error == "offline"
    assert sleeps == []  # no backoff on connectivity failures
    again = tool("q2")  # remembered: no second network attempt
    assert again.text.startswith("[offline]") and state["calls"] == 1


def test_web_search_connection_error_and_no_results(monkeypatch) -> None:
    from ddgs.exceptions import DDGSException

    install_fake_ddgs(monkeypatch, lambda n, q: (_ for _ in ()).throw(ConnectionError("refused")))
    assert WebSearch()("q").text.startswith("[offline]")
    install_fake_ddgs(monkeypatch, lambda n, q: (_ for _ in ()).throw(DDGSException("No results found.")))
    obs = WebSearch()("q")
    assert obs.ok and "No web results" in obs.text
    assert not WebSearch()(" ").ok


# ---------------------------------------------------------------- crawl_page


class FakeClient:
    def __init__(self, responses):
        self.responses = list(responses)
        self.calls: list[str] = []

    def get(self, url, **kwargs):
        self.calls.append(url)
        item = self.responses.pop(0)
        if isinstance(item, Exception):
            raise item
        return item


def test_crawl_page_store_first_no_network() -> None:
    client = FakeClient([])  # any network use would IndexError
    tool = CrawlPage(store={"https://ex.org/page": PAGE}, client=client)
    obs = tool("https://ex.org/page#section")
    assert obs.ok and obs.text.startswith("[https://ex.org/page#section] Example Page")
    assert "First paragraph" in obs.text and client.calls == []


def test_crawl_page_directory_store(tmp_path) -> None:
    store = PageStore(directory=tmp_path / "pages")
    store.put("https://ex.org/a", PAGE)
    assert (tmp_path / "pages" / "index.json").exists()
    tool = CrawlPage(store=tmp_path / "pages", offline_only=True)
    assert "Heading" in tool("https://ex.org/a").text
    missing = tool("https://ex.org/b")
    assert not missing.ok and missing.text.startswith("[offline]")


def test_crawl_page_two_urls(monkeypatch) -> None:
    client = FakeClient([httpx.Response(200, text="<p>remote page</p>")])
    tool = CrawlPage(store={"https://a.org/": "<title>A</title><p>stored</p>"}, client=client)
    obs = tool("https://a.org/ | https://b.org/x")
    assert obs.ok and "stored" in obs.text and "remote page" in obs.text
    assert client.calls == ["https://b.org/x"]


def test_crawl_page_429_backoff_then_ok() -> None:
    client = FakeClient([httpx.Response(429), httpx.Response(429, headers={"Retry-After": "3"}),
                         httpx.Response(200, text="<p>finally</p>")])
    sleeps: list[float] = []
    obs = CrawlPage(client=client, base_delay_s=0.5, sleep=sleeps.append)("https://x.org")
    assert obs.ok and "finally" in obs.text
    assert sleeps == [0.5, 3.0] and len(client.calls) == 3  # Retry-After beats 1.0


def test_crawl_page_429_exhausted() -> None:
    client = FakeClient([httpx.Response(429)] * 3)
    sleeps: list[float] = []
    obs = CrawlPage(client=client, retries=2, base_delay_s=1, sleep=sleeps.append)("https://x.org")
    assert not obs.ok and "[rate limited]" in obs.text and sleeps == [1, 2]


def test_crawl_page_offline(monkeypatch) -> None:
    def refuse(url, **kwargs):
        raise httpx.ConnectError("[Errno -2] Name or service not known")

    monkeypatch.setattr(httpx, "get", refuse)
    sleeps: list[float] = []
    obs = CrawlPage(sleep=sleeps.append)("https://unreachable.example")
    assert not obs.ok and obs.text.startswith("[offline]") and obs.error == "offline"
    assert sleeps == []


def test_crawl_page_http_error_and_bad_args() -> None:
    client = FakeClient([httpx.Response(404)])
    obs = CrawlPage(client=client)("https://x.org/missing")
    assert not obs.ok and "HTTP 404" in obs.text
    assert CrawlPage()("").text.startswith("[tool error] no URL")
    assert "not an http(s) URL" in CrawlPage()("file:///etc/passwd").text


# ---------------------------------------------------------------- goal-directed summary

from coa_lab.tools.page_summary import NOTHING, parse_crawl_arg  # noqa: E402

BRIDGE = ("<html><head><title>Golden Gate Bridge</title></head><body><nav>Menu</nav>"
          "<p>The Golden Gate Bridge is a suspension bridge in San Francisco.</p>"
          "<p>It opened to traffic on May 27, 1937. " + "Filler sentence about fog. " * 400 + "</p></body></html>")


class FakeReply:
    def __init__(self, text: str) -> None:
        self.text = text


class FakeBackend:
    """Records the conversations; answers with ``reply(messages)`` or raises."""

    def __init__(self, reply=None, error: Exception | None = None) -> None:
        self.reply, self.error = reply, error
        self.calls: list[dict] = []

    def chat(self, conversations, max_new_tokens, temperature=0.0):
        self.calls.append({"conversations": conversations, "max_new_tokens": max_new_tokens,
                           "temperature": temperature})
        if self.error is not None:
            raise self.error
        return [FakeReply(self.reply(msgs)) for msgs in conversations]


def test_parse_crawl_arg_goal_syntax() -> None:
    assert parse_crawl_arg("https://a.org") == (["https://a.org"], None)
    assert parse_crawl_arg("https://a.org | https://b.org || goal: opening date") == (
        ["https://a.org", "https://b.org"], "opening date")
    assert parse_crawl_arg("https://a.org||when did it open") == (["https://a.org"], "when did it open")
    assert parse_crawl_arg("https://a.org goal: the  architect") == (["https://a.org"], "the architect")
    assert parse_crawl_arg("https://a.org ||   ") == (["https://a.org"], None)


def test_crawl_page_summary_goes_to_backend() -> None:
    backend = FakeBackend(reply=lambda msgs: "<think>scan the page</think> It opened on May 27, 1937.")
    tool = CrawlPage(store={"https://gg.org/bridge": BRIDGE}, offline_only=True, summarizer=backend,
                     summary_input_chars=2000, summary_max_new_tokens=128)
    obs = tool("https://gg.org/bridge || goal: when did the bridge open")
    assert obs.ok, obs.text
    assert obs.text == ("[https://gg.org/bridge] Golden Gate Bridge\n"
                        "[summary for goal: when did the bridge open]\nIt opened on May 27, 1937.")
    (call,) = backend.calls
    assert call["max_new_tokens"] == 128 and call["temperature"] == 0.0
    (msgs,) = call["conversations"]
    assert [m["role"] for m in msgs] == ["system", "user"] and NOTHING in msgs[0]["content"]
    user = msgs[1]["content"]
    assert user.startswith("Goal: when did the bridge open\nPage: https://gg.org/bridge (Golden Gate Bridge)")
    assert "opened to traffic on May 27, 1937" in user and "Menu" not in user
    assert "[page truncated]" in user and len(user) < 2300  # page text cut to summary_input_chars


def test_crawl_page_summary_batches_pages_and_keeps_failures() -> None:
    backend = FakeBackend(reply=lambda msgs: "summary of " + msgs[1]["content"].split("Page: ")[1].split()[0])
    client = FakeClient([httpx.Response(500, text="boom")])
    tool = CrawlPage(store={"https://a.org/1": "<p>one</p>", "https://a.org/2": "<p>two</p>"},
                     client=client, retries=0, summarizer=backend)
    obs = tool("https://a.org/1 | https://down.org | https://a.org/2")  # no goal: generic summary
    assert len(backend.calls) == 1 and len(backend.calls[0]["conversations"]) == 2  # one batched call
    assert "Goal: the main facts" in backend.calls[0]["conversations"][0][1]["content"]
    assert "[summary]\nsummary of https://a.org/1" in obs.text
    assert "[summary]\nsummary of https://a.org/2" in obs.text
    assert "[https://down.org] [error]" in obs.text and not obs.ok


@pytest.mark.parametrize("backend", [
    FakeBackend(error=RuntimeError("teacher endpoint answered HTTP 503")),
    FakeBackend(reply=lambda msgs: "   "),
    type("WrongCount", (), {"chat": lambda self, c, max_new_tokens, temperature=0.0: []})(),
])
def test_crawl_page_summary_failure_falls_back_to_raw_text(backend) -> None:
    tool = CrawlPage(store={"https://gg.org/bridge": BRIDGE}, offline_only=True, summarizer=backend)
    obs = tool("https://gg.org/bridge || goal: opening date")
    assert obs.ok  # the page itself was fetched fine
    assert "[summary unavailable:" in obs.text and "raw page text follows" in obs.text
    assert "suspension bridge in San Francisco" in obs.text
    assert len(obs.text) <= tool.max_output_chars + 100


def test_crawl_page_rejects_summarizer_without_chat() -> None:
    with pytest.raises(TypeError, match="chat"):
        CrawlPage(summarizer=object())
    assert "|| goal:" in CrawlPage.description
