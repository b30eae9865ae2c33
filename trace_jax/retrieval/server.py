"""An HTTP server answering Search-R1's `/retrieve` protocol from a BM25 index.

Request (POST /retrieve): `{"queries": [str, ...], "topk": int | null, "return_scores": bool}`.
Response: `{"result": [...]}`, one list per query: documents `{"id", "contents"}` best first, or
`{"document": doc, "score": float}` pairs when return_scores is true. This is what Search-R1's
`retrieval_server.py` returns, so its e5 server and this one are interchangeable.

Each request runs on its own thread (`ThreadingHTTPServer`): a slow batch does not hold up others.
Bad requests get HTTP 400 with a JSON `{"error": ...}` naming the problem.
"""

from __future__ import annotations

import json
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol


class Searcher(Protocol):
    def search(self, queries: list[str], topk: int) -> tuple[list[list[dict]], list[list[float]]]: ...


def parse_request(body: bytes, default_topk: int) -> tuple[list[str], int, bool]:
    """(queries, topk, return_scores) of a request body; ValueError naming what is wrong."""
    try:
        req = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"request body is not JSON: {e}") from None
    if not isinstance(req, dict):
        raise ValueError('request must be a JSON object {"queries": [...], "topk": k, "return_scores": bool}')
    queries = req.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise ValueError('"queries" must be a list of strings')
    topk = req.get("topk") or default_topk
    if not isinstance(topk, int) or topk < 1:
        raise ValueError(f'"topk" must be a positive integer, got {req.get("topk")!r}')
    return queries, topk, bool(req.get("return_scores", False))


def respond(searcher: Searcher, queries: list[str], topk: int, return_scores: bool) -> dict:
    docs, scores = searcher.search(queries, topk)
    if return_scores:
        return {"result": [[{"document": d, "score": s} for d, s in zip(ds, ss)] for ds, ss in zip(docs, scores)]}
    return {"result": docs}


def make_server(searcher: Searcher, host: str = "127.0.0.1", port: int = 8000, default_topk: int = 3
                ) -> ThreadingHTTPServer:
    """A server bound to (host, port) (port 0: any free port, see `server.server_port`), not yet serving."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: HTTPStatus, payload: dict) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/retrieve":
                self._send(HTTPStatus.NOT_FOUND, {"error": f"no endpoint {self.path}; POST /retrieve"})
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                queries, topk, return_scores = parse_request(body, default_topk)
            except ValueError as e:
                self._send(HTTPStatus.BAD_REQUEST, {"error": str(e)})
                return
            self._send(HTTPStatus.OK, respond(searcher, queries, topk, return_scores))

        def log_message(self, *args) -> None:  # one line per request would swamp a training log
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def serve_in_thread(server: ThreadingHTTPServer) -> threading.Thread:
    """Serve until `server.shutdown()`, on a daemon thread (tests, notebooks, benchmarks)."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return thread
