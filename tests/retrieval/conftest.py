"""A small wiki-18 style corpus, its BM25 index and a live server on a free loopback port."""

import json

import numpy as np
import pytest

from trace_jax.retrieval.bm25 import Bm25Index, build_index
from trace_jax.retrieval.server import make_server, serve_in_thread

WORDS = [f"w{chr(97 + i)}{chr(97 + j)}" for i in range(12) for j in range(12)]  # 144 made-up words, no stopwords


def make_corpus(path, n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        words = rng.choice(WORDS, size=rng.integers(3, 20)).tolist()
        docs.append({"id": str(i), "contents": f'"Title {i}"\n' + " ".join(words)})
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return docs


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    return path, make_corpus(path, 60)


@pytest.fixture(scope="session")
def index(corpus, tmp_path_factory):
    return Bm25Index(build_index(corpus[0], tmp_path_factory.mktemp("index")))


@pytest.fixture
def server(index):
    srv = make_server(index, port=0)
    serve_in_thread(srv)
    yield f"http://127.0.0.1:{srv.server_port}/retrieve"
    srv.shutdown()
    srv.server_close()
