"""The "wiki_search" tool: BM25 over a local Wikipedia passage corpus.

The paper's multi-hop QA agents search the web; the lab searches a shipped, fixed corpus
instead (``datasets/corpus/wiki_passages.jsonl.gz``) so that runs are offline,
reproducible and free.  BM25 (via ``bm25s``) is the retriever because it needs no model,
indexes ~16k passages in about a second and answers a query in a few milliseconds.

The index is built once per corpus *content* and cached under
``cache_dir()/bm25/<sha256 of the file + settings>``: editing the corpus invalidates it,
copying the corpus elsewhere does not.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from coa_lab.paths import DATASETS_DIR, cache_dir
from coa_lab.tools.base import Observation, Tool, error_observation

DEFAULT_CORPUS = DATASETS_DIR / "corpus" / "wiki_passages.jsonl.gz"
# Bump when tokenization changes, so old cached indexes are not reused.
_INDEX_VERSION = "bm25s-v1-en-stopwords-title+text"
_STOPWORDS = "en"


def load_passages(path: str | os.PathLike[str]) -> list[dict[str, str]]:
    """Read {"id","title","text"} JSON lines from a .jsonl or .jsonl.gz file."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"passage corpus not found at {path}. Build it with "
            "`PYTHONPATH=. python datasets/build_corpus.py`, or pass corpus_path=... "
            "(JSON lines of {\"id\", \"title\", \"text\"}), or use WikiSearch.from_passages([...])"
        )
    opener = gzip.open if path.suffix == ".gz" else open
    passages: list[dict[str, str]] = []
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                passages.append({"id": str(row.get("id", lineno)), "title": str(row["title"]),
                                 "text": str(row["text"])})
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: not a {{title, text}} JSON object ({exc})") from exc
    if not passages:
        raise ValueError(f"passage corpus {path} is empty")
    return passages


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _index_text(p: dict[str, str]) -> str:
    # The title carries the entity name multi-hop questions ask about; index it with the text.
    return f"{p['title']}. {p['text']}"


def _tokenize(texts: list[str], *, ids: bool):
    import bm25s

    return bm25s.tokenize(texts, stopwords=_STOPWORDS, return_ids=ids, show_progress=False)


def build_index(passages: list[dict[str, str]]):
    """A fresh ``bm25s.BM25`` over ``passages`` (title + text)."""
    import bm25s

    retriever = bm25s.BM25()
    retriever.index(_tokenize([_index_text(p) for p in passages], ids=True), show_progress=False)
    return retriever


class WikiSearch(Tool):
    """BM25 search over Wikipedia passages; ``run(query)`` returns the top-k numbered."""

    name = "wiki_search"
    description = "search a local Wikipedia passage corpus (BM25); argument: a short keyword query"

    def __init__(self, corpus_path: str | os.PathLike[str] | None = None, k: int = 3,
                 max_output_chars: int = 1500, use_cache: bool = True,
                 max_passage_chars: int = 600) -> None:
        self.corpus_path = Path(corpus_path) if corpus_path is not None else DEFAULT_CORPUS
        if not self.corpus_path.exists():
            load_passages(self.corpus_path)  # raises the FileNotFoundError with build hints
        self.k = k
        self.max_output_chars = max_output_chars
        self.max_passage_chars = max_passage_chars
        self.use_cache = use_cache
        self._passages: list[dict[str, str]] | None = None
        self._retriever = None
        # Agents may call the tool from a thread pool; build the index only once.
        self._lock = threading.Lock()

    @classmethod
    def from_passages(cls, passages: list[dict[str, Any]], k: int = 3, **kwargs: Any) -> "WikiSearch":
        """An in-memory index (no file, no cache) for tests and notebooks."""
        rows = [{"id": str(p.get("id", i)), "title": str(p["title"]), "text": str(p["text"])}
                for i, p in enumerate(passages)]
        if not rows:
            raise ValueError("from_passages needs at least one passage")
        self = cls.__new__(cls)
        self.corpus_path = None
        self.k = k
        self.max_output_chars = kwargs.get("max_output_chars", 1500)
        self.max_passage_chars = kwargs.get("max_passage_chars", 600)
        self.use_cache = False
        self._passages = rows
        self._retriever = build_index(rows)
        self._lock = threading.Lock()
        return self

    # -- index ---------------------------------------------------------------------

    def _ensure_index(self) -> None:
        with self._lock:
            if self._retriever is not None:
                return
            assert self.corpus_path is not None
            passages = load_passages(self.corpus_path)
            if not self.use_cache:
                self._passages, self._retriever = passages, build_index(passages)
                return
            import bm25s

            key = hashlib.sha256(
                f"{_file_digest(self.corpus_path)}|{_INDEX_VERSION}|{bm25s.__version__}".encode()
            ).hexdigest()[:24]
            index_dir = cache_dir() / "bm25" / key
            retriever = None
            if (index_dir / "params.index.json").exists():
                try:
                    retriever = bm25s.BM25.load(index_dir, show_progress=False)
                except Exception:  # a half-written or foreign cache: rebuild it
                    retriever = None
            if retriever is None:
                retriever = build_index(passages)
                self._save(retriever, index_dir)
            self._passages, self._retriever = passages, retriever

    @staticmethod
    def _save(retriever, index_dir: Path) -> None:
        # Write to a sibling temp dir and rename, so a concurrent reader never sees a
        # half-written index.
        index_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=index_dir.parent, prefix=".tmp-"))
        try:
            retriever.save(tmp, show_progress=False)
            try:
                os.replace(tmp, index_dir)
            except OSError:  # someone else won the race; theirs is as good as ours
                pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @property
    def num_passages(self) -> int:
        self._ensure_index()
        assert self._passages is not None
        return len(self._passages)

    # -- querying ------------------------------------------------------------------

    def search(self, query: str, k: int | None = None) -> list[dict[str, Any]]:
        """Top-``k`` passages as ``{"id", "title", "text", "score"}``, best first (score > 0)."""
        self._ensure_index()
        assert self._passages is not None
        k = min(k or self.k, len(self._passages))
        tokens = _tokenize([query], ids=False)
        if not tokens[0]:
            return []  # only stopwords/punctuation: nothing to match
        docs, scores = self._retriever.retrieve(tokens, k=k, show_progress=False)
        hits = []
        for idx, score in zip(docs[0].tolist(), scores[0].tolist()):
            if score <= 0:
                continue
            p = self._passages[int(idx)]
            hits.append({"id": p["id"], "title": p["title"], "text": p["text"], "score": float(score)})
        return hits

    def run(self, arg: str) -> Observation:
        query = " ".join(arg.split())
        if not query:
            return error_observation("empty query: pass a few keywords, e.g. 'Eiffel Tower height'")
        hits = self.search(query)
        if not hits:
            return Observation(text=f"No passages match {query!r}.", ok=True, latency_s=0.0)
        lines = []
        for i, h in enumerate(hits, 1):
            text = h["text"]
            if len(text) > self.max_passage_chars:
                text = text[: self.max_passage_chars].rsplit(" ", 1)[0] + " ..."
            lines.append(f"({i}) {h['title']}: {text}")
        return Observation(text="\n".join(lines), ok=True, latency_s=0.0)
