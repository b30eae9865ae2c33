"""The BM25 index against a plain NumPy BM25 (Lucene variant, k1 = 1.5, b = 0.75)."""

import json
import math
from collections import Counter

import numpy as np
import pytest

from trace_jax.retrieval.bm25 import Bm25Index, build_index
from trace_jax.retrieval.corpus import CorpusError


def reference_scores(docs: list[dict], query: str, k1: float = 1.5, b: float = 0.75) -> np.ndarray:
    """[N] BM25 of every passage (title + text): a sum over the query's terms, repeats included (as Lucene)."""
    toks = [d["contents"].lower().replace('"', " ").split() for d in docs]
    toks = [[t for t in ts if len(t) >= 2] for ts in toks]
    avg = sum(map(len, toks)) / len(toks)
    scores = np.zeros(len(docs))
    for term in query.lower().split():
        df = sum(term in ts for ts in toks)
        idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
        for i, ts in enumerate(toks):
            tf = Counter(ts)[term]
            scores[i] += idf * tf / (tf + k1 * (1 - b + b * len(ts) / avg))
    return scores


@pytest.mark.parametrize("query", ["waa wbc", "wll", "wcd wcd wef wgh", "title wkk"])
def test_search_equals_reference_bm25(index, corpus, query):
    _, docs = corpus
    got_docs, got_scores = index.search([query], topk=5)
    ref = reference_scores(docs, query)
    np.testing.assert_allclose(got_scores[0], np.sort(ref)[::-1][:5], rtol=1e-5, atol=1e-5)
    for doc, s in zip(got_docs[0], got_scores[0]):
        assert doc == docs[int(doc["id"])]  # the passage itself, read back from the corpus file
        assert ref[int(doc["id"])] == pytest.approx(s, rel=1e-5, abs=1e-5)


def test_odd_queries_and_small_corpora(index, corpus):
    docs, scores = index.search(["", "zzz unknown", "the of a", "!!!"], topk=3)
    assert [len(d) for d in docs] == [3, 3, 3, 3] and all(s == [0.0, 0.0, 0.0] for s in scores)
    assert index.search([], topk=3) == ([], [])
    docs, _ = index.search(["waa"], topk=1000)
    assert len(docs[0]) == len(corpus[1])  # k is capped at the corpus size


def test_bad_corpus_and_changed_corpus_are_named(tmp_path, corpus):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "0", "contents": "\\"t\\"\\nx"}\n{"id": 1}\n')
    with pytest.raises(CorpusError, match=r"bad.jsonl:2: needs a string field `contents`"):
        build_index(bad, tmp_path / "i")
    bad.write_text("not json\n")
    with pytest.raises(CorpusError, match=r"bad.jsonl:1: not a JSON object"):
        build_index(bad, tmp_path / "i")
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"id": "0", "contents": '"T"\nalpha beta'}) + "\n")
    build_index(good, tmp_path / "g")
    good.write_text(json.dumps({"id": "0", "contents": '"T"\nalpha beta gamma'}) + "\n")
    with pytest.raises(CorpusError, match="missing or changed since; rebuild the index"):
        Bm25Index(tmp_path / "g")
    with pytest.raises(FileNotFoundError, match="trace-jax retrieve index"):
        Bm25Index(tmp_path / "nothing")
