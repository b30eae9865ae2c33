"""`trace-jax bench retriever`: queries per second of the built-in BM25 server over HTTP.

A synthetic corpus (Zipf-distributed made-up words, wiki-18 format) is indexed, the server runs in a
separate process (`trace-jax retrieve serve`), and client threads send batched top-k requests for a
fixed time. Printed: the in-process search rate (no HTTP, the upper bound), one client at a time, and
`--clients` at once, with the ratio of the last two.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

from trace_jax.retrieval.bm25 import Bm25Index, build_index


def synthetic_corpus(path: Path, passages: int, seed: int = 0, vocab: int = 30000) -> list[str]:
    """Write `passages` passages of 40-100 Zipf-distributed words; returns the word list."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}x" for i in range(vocab)]
    with path.open("w") as f:
        for i in range(passages):
            ids = np.minimum(rng.zipf(1.3, size=rng.integers(40, 100)), vocab) - 1
            f.write(json.dumps({"id": str(i), "contents": f'"Title {i}"\n' + " ".join(words[j] for j in ids)}) + "\n")
    return words


def queries(words: list[str], n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words[:5000], size=rng.integers(3, 7))) for _ in range(n)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rate(url: str, words: list[str], clients: int, batch: int, topk: int, seconds: float) -> float:
    """Queries answered per second by `clients` threads sending batches for `seconds`."""
    done = [0] * clients
    bodies = [[json.dumps({"queries": queries(words, batch, seed=1000 * c + k), "topk": topk,
                           "return_scores": True}).encode() for k in range(64)] for c in range(clients)]
    stop = time.perf_counter() + seconds

    def client(c: int) -> None:
        k = 0
        while time.perf_counter() < stop:
            with urllib.request.urlopen(urllib.request.Request(url, data=bodies[c][k % 64]), timeout=60) as r:
                done[c] += len(json.loads(r.read())["result"])
            k += 1

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - start)


def run_retriever_bench(passages: int, topk: int, batch: int, clients: int, seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        words = synthetic_corpus(corpus, passages)
        t0 = time.perf_counter()
        build_index(corpus, Path(tmp) / "index")
        index_s = time.perf_counter() - t0
        index = Bm25Index(Path(tmp) / "index")
        qs = queries(words, 512, seed=7)
        t0 = time.perf_counter()
        for i in range(0, len(qs), batch):
            index.search(qs[i:i + batch], topk)
        local = len(qs) / (time.perf_counter() - t0)
        del index
        port = _free_port()
        server = subprocess.Popen([sys.executable, "-m", "trace_jax.cli", "retrieve", "serve", "--index",
                                   str(Path(tmp) / "index"), "--port", str(port)],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            server.stdout.readline()  # "serving ...": ready
            url = f"http://127.0.0.1:{port}/retrieve"
            one = _rate(url, words, 1, batch, topk, seconds)
            many = _rate(url, words, clients, batch, topk, seconds)
        finally:
            server.terminate()
            server.wait()
    out = {"index_seconds": index_s, "in_process_qps": local, "one_client_qps": one, "concurrent_qps": many}
    print(f"bench retriever: {passages} passages (indexed in {index_s:.1f} s), top-{topk}, batches of {batch}")
    print(f"  in process (no HTTP):        {local:8.0f} queries/s")
    print(f"  HTTP, 1 client:              {one:8.0f} queries/s")
    print(f"  HTTP, {clients} concurrent clients:  {many:8.0f} queries/s ({many / one:.2f}x one client)")
    return out
