"""A client of the Search-R1 `/retrieve` protocol: batched, with timeouts, retries with backoff and an
on-disk cache.

Every call either returns within about `timeout_s * (retries + 1) + backoff` seconds or raises
`RetrieverError` naming the URL: a training run never hangs on a dead retriever. An attempt that has not
received its whole response within `timeout_s` is abandoned and retried, however slowly the bytes arrive.
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.client
import json
import sqlite3
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path


class RetrieverError(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class RetrieverConfig:
    """How the search QA environment calls its retriever."""

    url: str = "http://127.0.0.1:8000/retrieve"  # the /retrieve endpoint (Search-R1's protocol)
    topk: int = 3  # passages per query
    timeout_s: float = 30.0  # per HTTP request, connecting to the whole response
    retries: int = 3  # further attempts after a failed request
    backoff_s: float = 0.5  # wait before retry r: backoff_s * 2**r
    batch_size: int = 256  # queries per HTTP request
    cache_dir: str | None = None  # on-disk cache of (url, topk, query) -> passages; None: no cache

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"retriever.url must be an http(s) URL, got {self.url!r}")
        for name in ("topk", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"retriever.{name} must be >= 1, got {getattr(self, name)}")
        if self.timeout_s <= 0 or self.retries < 0 or self.backoff_s < 0:
            raise ValueError("retriever.timeout_s must be > 0, retries and backoff_s >= 0")


def _check_response(payload: object, n: int) -> list[list[dict]]:
    """The `result` of a response with scores: n lists of {"document": {"contents": str, ...}, "score"}."""
    result = payload.get("result") if isinstance(payload, dict) else None
    if not isinstance(result, list) or len(result) != n:
        raise ValueError(f'expected {{"result": [...]}} with {n} lists, got {str(payload)[:200]}')
    for hits in result:
        if not isinstance(hits, list) or not all(
                isinstance(h, dict) and isinstance(h.get("document"), dict)
                and isinstance(h["document"].get("contents"), str) for h in hits):
            raise ValueError(f"malformed hits {str(hits)[:200]}")
    return result


class _Cache:
    """(url, topk, query) -> hits, in one sqlite file shared by threads."""

    def __init__(self, cache_dir: str):
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(Path(cache_dir) / "retrieval_cache.sqlite", check_same_thread=False)
        self._db.execute("CREATE TABLE IF NOT EXISTS hits (key TEXT PRIMARY KEY, value TEXT)")
        self._lock = threading.Lock()

    @staticmethod
    def key(url: str, topk: int, query: str) -> str:
        return hashlib.sha256(json.dumps([url, topk, query]).encode()).hexdigest()

    def get(self, keys: list[str]) -> dict[str, list[dict]]:
        with self._lock:
            found = {}
            for k in keys:
                row = self._db.execute("SELECT value FROM hits WHERE key = ?", (k,)).fetchone()
                if row:
                    found[k] = json.loads(row[0])
            return found

    def put(self, items: dict[str, list[dict]]) -> None:
        with self._lock, self._db:
            self._db.executemany("INSERT OR REPLACE INTO hits VALUES (?, ?)",
                                 [(k, json.dumps(v)) for k, v in items.items()])


RETRIED_CODES = (408, 429)  # request timeout, too many requests: the same request may succeed later


def _read_by(response: http.client.HTTPResponse, deadline: float) -> bytes:
    """The response's body, or TimeoutError once `deadline` (time.monotonic) passes: the socket's timeout bounds
    each read, not a server that sends a byte at a time."""
    parts = []
    while chunk := response.read1(1 << 16):
        parts.append(chunk)
        if time.monotonic() > deadline:
            raise TimeoutError("the response did not arrive within timeout_s")
    if response.length:  # bytes its Content-Length promised and the connection closed before (read1 only stops)
        raise http.client.IncompleteRead(b"".join(parts), response.length)
    return b"".join(parts)


class RetrieverClient:
    def __init__(self, cfg: RetrieverConfig):
        self.cfg = cfg
        self._cache = _Cache(cfg.cache_dir) if cfg.cache_dir else None

    def _post(self, queries: list[str]) -> list[list[dict]]:
        cfg = self.cfg
        body = json.dumps({"queries": queries, "topk": cfg.topk, "return_scores": True}).encode()
        error: Exception | None = None
        for attempt in range(cfg.retries + 1):
            if attempt:
                time.sleep(cfg.backoff_s * 2 ** (attempt - 1))
            request = urllib.request.Request(cfg.url, data=body, headers={"Content-Type": "application/json"})
            deadline = time.monotonic() + cfg.timeout_s
            try:
                with urllib.request.urlopen(request, timeout=cfg.timeout_s) as response:
                    result = _check_response(json.loads(_read_by(response, deadline)), len(queries))
                return result
            except urllib.error.HTTPError as e:
                if e.code < 500 and e.code not in RETRIED_CODES:  # the request itself is wrong: retrying repeats it
                    raise RetrieverError(f"retriever at {cfg.url} rejected the request: HTTP {e.code} "
                                         f"{e.read()[:300]!r}") from None
                error = e
            # refused, reset, timed out, cut short or garbled (http.client), malformed JSON or shape
            except (OSError, http.client.HTTPException, ValueError) as e:
                error = e
        raise RetrieverError(f"retriever at {cfg.url} failed {cfg.retries + 1} times; last error: {error!r}. "
                             "Is it running? Start one with `trace-jax retrieve serve --corpus CORPUS.jsonl --port P` "
                             "(the tiny kit's: --corpus artifacts/search_qa_tiny/corpus.jsonl --port 8000), or "
                             "`--index DIR` for an index built by `trace-jax retrieve index`; or set retriever.url"
                             ) from None

    def retrieve(self, queries: list[str]) -> list[list[dict]]:
        """The top-k hits `{"document": {"id", "contents"}, "score"}` of every query, in order."""
        keys = [_Cache.key(self.cfg.url, self.cfg.topk, q) for q in queries]
        found = self._cache.get(keys) if self._cache else {}
        todo = list(dict.fromkeys(q for q, k in zip(queries, keys) if k not in found))
        fetched = {}
        for start in range(0, len(todo), self.cfg.batch_size):
            batch = todo[start:start + self.cfg.batch_size]
            for q, hits in zip(batch, self._post(batch)):
                fetched[_Cache.key(self.cfg.url, self.cfg.topk, q)] = hits
        if self._cache and fetched:
            self._cache.put(fetched)
        found.update(fetched)
        return [found[k] for k in keys]
