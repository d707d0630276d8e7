"""BM25 wiki_search: ranking, formatting, errors and the on-disk index cache."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from coa_lab.tools.wiki_search import DEFAULT_CORPUS, WikiSearch, load_passages

PASSAGES = [
    {"id": "a", "title": "Eiffel Tower", "text": "The Eiffel Tower is a wrought-iron lattice tower in Paris, France."},
    {"id": "b", "title": "Big Ben", "text": "Big Ben is the nickname for the Great Bell of the clock in London."},
    {"id": "c", "title": "Mount Fuji", "text": "Mount Fuji is the highest mountain in Japan, near Tokyo."},
    {"id": "d", "title": "Louvre", "text": "The Louvre is the world's most-visited museum, located in Paris."},
]


def write_corpus(path: Path, rows: list[dict]) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def test_from_passages_ranks_and_formats() -> None:
    ws = WikiSearch.from_passages(PASSAGES)
    hits = ws.search("iron tower Paris", k=2)
    assert [h["title"] for h in hits][0] == "Eiffel Tower"
    assert set(hits[0]) >= {"title", "text", "score"} and hits[0]["score"] > 0
    obs = ws("highest mountain Japan")
    assert obs.ok and obs.text.startswith("(1) Mount Fuji: Mount Fuji is the highest")
    two = ws("Paris")
    assert "(1) " in two.text and "(2) " in two.text  # both Paris passages, numbered


def test_title_is_searchable() -> None:
    ws = WikiSearch.from_passages(PASSAGES)
    assert ws.search("Louvre", k=1)[0]["id"] == "d"


def test_empty_and_unmatched_queries() -> None:
    ws = WikiSearch.from_passages(PASSAGES)
    empty = ws("   ")
    assert not empty.ok and empty.text.startswith("[tool error] empty query")
    none = ws("zzzqqq xylophone")
    assert none.ok and "No passages match" in none.text
    assert ws.search("the of and") == []  # only stopwords


def test_k_larger_than_corpus() -> None:
    ws = WikiSearch.from_passages(PASSAGES[:2], k=10)
    assert len(ws.search("Eiffel Big Ben")) <= 2


def test_missing_corpus_is_clear(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="build_corpus.py"):
        WikiSearch(corpus_path=tmp_path / "missing.jsonl.gz")


def test_bad_corpus_line(tmp_path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text('{"title": "x"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_passages(p)


def test_index_cached_on_disk_and_invalidated(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("COA_LAB_CACHE", str(tmp_path / "cache"))
    corpus = write_corpus(tmp_path / "c.jsonl.gz", PASSAGES)
    first = WikiSearch(corpus_path=corpus)
    assert first.search("Fuji")[0]["title"] == "Mount Fuji"
    cached = list((tmp_path / "cache" / "bm25").iterdir())
    assert len(cached) == 1 and (cached[0] / "params.index.json").exists()

    import coa_lab.tools.wiki_search as ws_mod

    def no_build(_):  # a second instance must load, not rebuild
        raise AssertionError("index was rebuilt despite the cache")

    monkeypatch.setattr(ws_mod, "build_index", no_build)
    assert WikiSearch(corpus_path=corpus)("Big Ben clock").text.startswith("(1) Big Ben")
    monkeypatch.undo()
    monkeypatch.setenv("COA_LAB_CACHE", str(tmp_path / "cache"))

    write_corpus(corpus, PASSAGES + [{"id": "e", "title": "Colosseum", "text": "An amphitheatre in Rome."}])
    assert WikiSearch(corpus_path=corpus).search("amphitheatre Rome")[0]["title"] == "Colosseum"
    assert len(list((tmp_path / "cache" / "bm25").iterdir())) == 2  # new content -> new key


@pytest.mark.skipif(not DEFAULT_CORPUS.exists(), reason=f"shipped corpus not built at {DEFAULT_CORPUS}")
def test_shipped_corpus(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("COA_LAB_CACHE", str(tmp_path / "cache"))
    ws = WikiSearch()
    assert ws.num_passages >= 10_000
    obs = ws("Shirley Temple ambassador Ghana")
    assert obs.ok and "Shirley Temple" in obs.text.splitlines()[0]
