"""The tiny search QA kit's tokenizer (the kit itself: tests/conftest.py), its BM25 index and a live server."""

import threading

import pytest
from transformers import AutoTokenizer

from trace_jax.retrieval.bm25 import Bm25Index
from trace_jax.retrieval.server import make_server, serve_in_thread


@pytest.fixture(scope="session")
def tokenizer(kit):
    return AutoTokenizer.from_pretrained(kit / "policy")


@pytest.fixture(scope="session")
def index(kit):
    return Bm25Index(kit / "index")


class Counting:
    """The index behind the server, counting the queries it answers (`seen`: their texts); `fail_when()` true: the
    server dies."""

    def __init__(self, index, fail_when=lambda: False):
        self.index, self.fail_when, self.queries, self.seen = index, fail_when, 0, []
        self.server = None

    def search(self, queries, topk):
        if self.fail_when():
            threading.Thread(target=self.server.shutdown).start()  # killed: nothing answers from now on
            raise ConnectionError("retriever killed")
        self.queries += len(queries)
        self.seen += queries
        return self.index.search(queries, topk)


@pytest.fixture
def serve(index):
    """serve(fail_when=...) -> (url, Counting): the kit's index on a free loopback port."""
    servers = []

    def start(fail_when=lambda: False):
        searcher = Counting(index, fail_when)
        searcher.server = make_server(searcher, port=0)
        serve_in_thread(searcher.server)
        servers.append(searcher.server)
        return f"http://127.0.0.1:{searcher.server.server_port}/retrieve", searcher

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()
