"""Retrieval for search agents: a BM25 index over a wiki-18 style corpus, an HTTP server speaking
Search-R1's `/retrieve` protocol, and a batching, caching, retrying client."""
