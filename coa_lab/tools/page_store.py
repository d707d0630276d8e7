"""Readable text from HTML, and the offline ``PageStore`` that ``crawl_page`` reads first.

``html_to_text`` is a small stdlib ``HTMLParser`` pass (no lxml/readability dependency):
it drops scripts, styles and page chrome and keeps paragraph breaks.  ``PageStore`` maps
URLs to saved HTML, in memory or in a directory, so tests and offline notebooks replay
pages without a network.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urldefrag

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
