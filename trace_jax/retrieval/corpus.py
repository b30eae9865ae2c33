"""A passage corpus in the wiki-18 JSONL format: one `{"id": ..., "contents": "\"title\"\\ntext"}` per line.

Documents are read by byte offset from the file itself (`os.pread`, safe from many threads), so a
corpus of millions of passages costs one int64 per passage in memory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np


class CorpusError(ValueError):
    pass


def _parse(line: bytes, path: Path, lineno: int) -> dict:
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as e:
        raise CorpusError(f"{path}:{lineno}: not a JSON object ({e.msg}); each line must be "
                          '{"id": ..., "contents": "\\"title\\"\\ntext"}') from None
    if not isinstance(doc, dict) or not isinstance(doc.get("contents"), str):
        raise CorpusError(f"{path}:{lineno}: needs a string field `contents` (wiki-18 format: "
                          '{"id": ..., "contents": "\\"title\\"\\ntext"})')
    return doc


def scan(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(byte offset, document) for every non-blank line, validated."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus file {path} does not exist")
    with path.open("rb") as f:
        offset = 0
        for lineno, line in enumerate(f, 1):
            if line.strip():
                yield offset, _parse(line, path, lineno)
            offset += len(line)


class Corpus:
    """Random access to a JSONL corpus by passage index, through the line offsets [N] int64."""

    def __init__(self, path: str | Path, offsets: np.ndarray):
        self.path = Path(path)
        self.offsets = offsets
        self._fd = os.open(self.path, os.O_RDONLY)
        self._ends = np.append(offsets[1:], os.fstat(self._fd).st_size)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i: int) -> dict:
        start, end = int(self.offsets[i]), int(self._ends[i])
        return json.loads(os.pread(self._fd, end - start, start))

    def close(self) -> None:
        os.close(self._fd)
