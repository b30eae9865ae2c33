"""A BM25 index (bm25s) over a wiki-18 corpus, saved to a folder and searched in batches.

`build_index` writes the bm25s matrices, its tokenizer's vocabulary and the passages' line offsets
into the corpus file (recorded with its size: a changed corpus is refused at load).
"""

from __future__ import annotations

import json
from pathlib import Path

import bm25s
import numpy as np
from tqdm import tqdm

from trace_jax.retrieval.corpus import Corpus, CorpusError, scan

META = "trace_jax_index.json"


def _tokenizer() -> bm25s.tokenization.Tokenizer:
    return bm25s.tokenization.Tokenizer(stopwords="en")


def build_index(corpus_path: str | Path, index_dir: str | Path) -> Path:
    """Index every passage of corpus_path (title and text) into index_dir; returns index_dir."""
    corpus_path, index_dir = Path(corpus_path).resolve(), Path(index_dir)
    offsets, texts = [], []
    for offset, doc in tqdm(scan(corpus_path), desc="reading corpus", unit=" passages"):
        offsets.append(offset)
        texts.append(doc["contents"])
    if not texts:
        raise CorpusError(f"corpus {corpus_path} has no passages")
    tokenizer = _tokenizer()
    ids = tokenizer.tokenize(texts, show_progress=True)
    model = bm25s.BM25()
    model.index(ids, show_progress=True)
    index_dir.mkdir(parents=True, exist_ok=True)
    model.save(index_dir, show_progress=False)
    tokenizer.save_vocab(index_dir)
    tokenizer.save_stopwords(index_dir)
    np.save(index_dir / "offsets.npy", np.asarray(offsets, np.int64))
    meta = {"corpus": str(corpus_path), "corpus_bytes": corpus_path.stat().st_size, "passages": len(texts)}
    (index_dir / META).write_text(json.dumps(meta, indent=1))
    return index_dir


class Bm25Index:
    """A loaded index: `search(queries, topk)` -> (documents, scores) per query."""

    def __init__(self, index_dir: str | Path):
        index_dir = Path(index_dir)
        if not (index_dir / META).is_file():
            raise FileNotFoundError(f"{index_dir} is not an index; build one with "
                                    "`trace-jax retrieve index --corpus corpus.jsonl --index DIR`")
        meta = json.loads((index_dir / META).read_text())
        corpus_path = Path(meta["corpus"])
        if not corpus_path.is_file() or corpus_path.stat().st_size != meta["corpus_bytes"]:
            raise CorpusError(f"the corpus {corpus_path} indexed in {index_dir} is missing or changed since; "
                              "rebuild the index")
        self.model = bm25s.BM25.load(index_dir, show_progress=False)
        self.tokenizer = _tokenizer()
        self.tokenizer.load_vocab(index_dir)
        self.tokenizer.load_stopwords(index_dir)
        self.corpus = Corpus(corpus_path, np.load(index_dir / "offsets.npy"))

    def search(self, queries: list[str], topk: int) -> tuple[list[list[dict]], list[list[float]]]:
        """The top-k passages of each query, best first, with their BM25 scores (fewer when the corpus
        is smaller than k)."""
        k = min(topk, len(self.corpus))
        if not queries or k <= 0:
            return [[] for _ in queries], [[] for _ in queries]
        ids = self.tokenizer.tokenize(list(queries), update_vocab=False, show_progress=False)
        rows, scores = self.model.retrieve(ids, k=k, show_progress=False, n_threads=0)
        docs = [[self.corpus[int(i)] for i in row] for row in rows]
        return docs, [[float(s) for s in row] for row in scores]
