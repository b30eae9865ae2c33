"""The /retrieve protocol (Search-R1's JSON shapes), concurrency, and the client's batching, cache and faults."""

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from trace_jax.retrieval.client import RetrieverClient, RetrieverConfig, RetrieverError
from trace_jax.retrieval.server import make_server, serve_in_thread


def post(url: str, payload) -> tuple[int, dict]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_responses_have_search_r1_shapes(server, index):
    status, plain = post(server, {"queries": ["waa wbc", "wll"], "topk": 2, "return_scores": False})
    docs, scores = index.search(["waa wbc", "wll"], 2)
    assert status == 200 and plain == {"result": docs}
    assert all(set(d) == {"id", "contents"} for hits in plain["result"] for d in hits)
    _, scored = post(server, {"queries": ["waa wbc", "wll"], "topk": 2, "return_scores": True})
    assert scored == {"result": [[{"document": d, "score": s} for d, s in zip(ds, ss)]
                                 for ds, ss in zip(docs, scores)]}
    _, default = post(server, {"queries": ["wll"]})  # topk omitted: the server's default (3); no scores
    assert len(default["result"][0]) == 3 and "document" not in default["result"][0][0]


@pytest.mark.parametrize("body, message", [
    (b"{not json", "not JSON"),
    ({"queries": "one string"}, '"queries" must be a list of strings'),
    ({"queries": [1, 2]}, '"queries" must be a list of strings'),
    ({"queries": ["q"], "topk": -2}, '"topk" must be a positive integer'),
    ([1, 2], "must be a JSON object"),
])
def test_bad_requests_get_400_naming_the_problem(server, body, message):
    status, reply = post(server, body)
    assert status == 400 and message in reply["error"]


class SlowSearcher:
    def __init__(self, delay: float):
        self.delay = delay

    def search(self, queries, topk):
        time.sleep(self.delay)
        return [[{"id": q, "contents": f'"{q}"\ntext'}] for q in queries], [[1.0] for _ in queries]


def test_concurrent_requests_are_not_serialised():
    srv = make_server(SlowSearcher(0.4), port=0)
    serve_in_thread(srv)
    url = f"http://127.0.0.1:{srv.server_port}/retrieve"
    replies = []
    threads = [threading.Thread(target=lambda i=i: replies.append(post(url, {"queries": [f"q{i}"]})))
               for i in range(6)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    srv.shutdown()
    srv.server_close()
    assert sorted(r[1]["result"][0][0]["id"] for r in replies) == [f"q{i}" for i in range(6)]
    assert elapsed < 6 * 0.4 / 2, f"6 requests of 0.4 s took {elapsed:.2f} s: served one at a time"


def test_client_batches_in_order_and_matches_the_server(server, index):
    queries = ["waa", "wbb wcc", "waa", "wdd", "", "wee wff"]
    client = RetrieverClient(RetrieverConfig(url=server, topk=2, batch_size=2))
    hits = client.retrieve(queries)
    docs, scores = index.search(queries, 2)
    assert hits == [[{"document": d, "score": s} for d, s in zip(ds, ss)] for ds, ss in zip(docs, scores)]


def test_cache_answers_without_the_server(index, tmp_path):
    srv = make_server(index, port=0)
    serve_in_thread(srv)
    url = f"http://127.0.0.1:{srv.server_port}/retrieve"
    cfg = RetrieverConfig(url=url, cache_dir=str(tmp_path), retries=0, timeout_s=2)
    first = RetrieverClient(cfg).retrieve(["waa", "wbb"])
    srv.shutdown()
    srv.server_close()
    assert RetrieverClient(cfg).retrieve(["wbb", "waa"]) == first[::-1]  # a new client, the server gone
    with pytest.raises(RetrieverError, match=url):
        RetrieverClient(cfg).retrieve(["wcc"])


class Flaky:
    """A server that answers its first `failures` requests with `fault`, then correctly (1 hit per query). Faults:
    500 and 429 (status codes), malformed, wrong_count (bodies), slow (sleeps `delay` first), drip (the body a byte
    each 20 ms, every read well within a socket timeout), short (the body cut 10 bytes before its Content-Length)."""

    def __init__(self, fault: str, failures: int, delay: float = 0.0):
        self.calls = 0
        flaky = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                queries = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["queries"]
                flaky.calls += 1
                failing = flaky.calls <= failures
                if failing and fault == "slow":
                    time.sleep(delay)
                if failing and fault in ("500", "429"):
                    body, status = b'{"error": "boom"}', int(fault)
                elif failing and fault == "malformed":
                    body, status = b'{"result": [[{"document": 3}]', 200
                elif failing and fault == "wrong_count":
                    body, status = json.dumps({"result": []}).encode(), 200
                elif fault == "400":
                    body, status = b'{"error": "bad"}', 400
                else:
                    hits = [[{"document": {"id": q, "contents": f'"{q}"\nt'}, "score": 1.0}] for q in queries]
                    body, status = json.dumps({"result": hits}).encode(), 200
                self.send_response(status)
                self.send_header("Content-Length", str(len(body) + 10 * (failing and fault == "short")))
                self.end_headers()
                with contextlib.suppress(OSError):  # the client gave up (timeout)
                    for i in range(0, len(body), 1 if failing and fault == "drip" else len(body)):
                        self.wfile.write(body[i:i + (1 if failing and fault == "drip" else len(body))])
                        self.wfile.flush()
                        time.sleep(0.02 if failing and fault == "drip" else 0.0)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        serve_in_thread(self.server)
        self.url = f"http://127.0.0.1:{self.server.server_port}/retrieve"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("fault", ["500", "429", "malformed", "wrong_count", "slow", "drip", "short"])
def test_client_retries_faults_then_succeeds(fault):
    flaky = Flaky(fault, failures=2, delay=1.0)
    client = RetrieverClient(RetrieverConfig(url=flaky.url, retries=2, backoff_s=0.01, timeout_s=0.3))
    assert [h[0]["document"]["id"] for h in client.retrieve(["a", "b"])] == ["a", "b"]
    assert flaky.calls == 3
    flaky.close()


@pytest.mark.parametrize("fault", ["500", "malformed", "slow", "drip", "short"])
def test_client_gives_up_in_bounded_time_naming_the_url(fault):
    flaky = Flaky(fault, failures=100, delay=2.0)
    client = RetrieverClient(RetrieverConfig(url=flaky.url, retries=2, backoff_s=0.01, timeout_s=0.3))
    start = time.perf_counter()
    with pytest.raises(RetrieverError, match=f"retriever at {flaky.url} failed 3 times"):
        client.retrieve(["a"])
    assert time.perf_counter() - start < 3 * 0.3 + 1.0
    flaky.close()


def test_client_does_not_retry_a_rejected_request_and_a_dead_server_is_named():
    flaky = Flaky("400", failures=0)
    with pytest.raises(RetrieverError, match="rejected the request: HTTP 400"):
        RetrieverClient(RetrieverConfig(url=flaky.url, retries=3, backoff_s=0.01)).retrieve(["a"])
    assert flaky.calls == 1
    flaky.close()
    with pytest.raises(RetrieverError, match=r"127.0.0.1:9/retrieve failed 2 times.*trace-jax retrieve serve"):
        RetrieverClient(RetrieverConfig(url="http://127.0.0.1:9/retrieve", retries=1, backoff_s=0.01)).retrieve(["a"])


@pytest.mark.parametrize("field, value, message", [
    ("url", "localhost:8000", "must be an http"), ("topk", 0, "topk must be >= 1"),
    ("timeout_s", 0, "timeout_s must be > 0")])
def test_client_config_errors(field, value, message):
    with pytest.raises(ValueError, match=message):
        RetrieverConfig(**{field: value})
