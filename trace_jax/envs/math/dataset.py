"""Math problems through TFDS (array_record, no TensorFlow), from local files in the DeepScaleR format.

manual_dir holds `train.{jsonl,json,parquet}` and evaluation sets `eval/<set>.{jsonl,json,parquet}` (AIME24,
AMC23, MATH-500 exported to the same format). Each row needs `problem` and `answer` (a string or a number);
`solution` and `id` (or `unique_id`) are kept when present. A `.json` file is one JSON list (as DeepScaleR ships)
or JSON lines. Training problems that also appear in an evaluation set (same text up to case and spaces) are
dropped from the training split, and counted. Nothing is downloaded: `build_problems` builds the splits once per
content of manual_dir (a fingerprint names the build), `read_problems` reads one.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import tensorflow_datasets as tfds

from trace_jax.data.prepare import prepare

FORMATS = ("jsonl", "json", "parquet")
_SPLIT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def normalize(problem: str) -> str:
    """The text two copies of a problem share: lower case, spaces collapsed."""
    return " ".join(problem.lower().split())


def find_files(manual_dir: str | Path) -> dict[str, Path]:
    """{split: file}: "train" and one split per evaluation set; an error listing what was looked for."""
    root = Path(manual_dir)
    found = {}
    for fmt in FORMATS:
        if "train" not in found and (root / f"train.{fmt}").is_file():
            found["train"] = root / f"train.{fmt}"
    for path in sorted((root / "eval").glob("*")) if (root / "eval").is_dir() else []:
        if path.suffix[1:] not in FORMATS or path.stem in found:
            continue
        if not _SPLIT_NAME.match(path.stem) or path.stem == "train":
            raise ValueError(f"{path}: an evaluation set's name must be a Python identifier other than 'train' "
                             f"(letters, digits, _), e.g. {re.sub(r'[^A-Za-z0-9_]', '_', path.stem)}{path.suffix}")
        found[path.stem] = path
    if "train" not in found:
        raise FileNotFoundError(f"no training problems in {root}: expected train.jsonl, train.json or train.parquet "
                                "(rows with `problem` and `answer`, e.g. DeepScaleR's), and evaluation sets as "
                                "eval/<set>.jsonl; write the tiny kit with `trace-jax data math-tiny`")
    return found


def _rows(path: Path) -> Iterator[Any]:
    if path.suffix == ".parquet":
        yield from pq.read_table(path).to_pylist()
        return
    text = path.read_text()
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            yield from json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not a JSON list ({e.msg} at line {e.lineno})") from None
        return
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not JSON ({e.msg})") from None


def _example(row: Any, path: Path, i: int) -> dict[str, str]:
    ok = isinstance(row, dict) and isinstance(row.get("problem"), str) and row["problem"].strip() and \
        isinstance(row.get("answer"), str | int | float) and str(row["answer"]).strip()
    if not ok:
        raise ValueError(f"{path} row {i}: needs a non-empty string `problem` and an `answer` (string or number)")
    return {"id": str(row.get("id", row.get("unique_id", f"{path.stem}-{i}"))), "problem": row["problem"],
            "answer": str(row["answer"]).strip(), "solution": str(row.get("solution") or "")}


class MathProblems(tfds.core.GeneratorBasedBuilder):
    """Math problems with exact answers, in the DeepScaleR format."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    MANUAL_DOWNLOAD_INSTRUCTIONS = "Place train.jsonl (and eval/<set>.jsonl) under manual_dir."

    def _info(self) -> tfds.core.DatasetInfo:
        text = tfds.features.Text()
        return self.dataset_info_from_configs(features=tfds.features.FeaturesDict(
            {"id": text, "problem": text, "answer": text, "solution": text}))

    def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict[str, Any]:
        files = find_files(dl_manager.manual_dir)
        evals = {s: [_example(r, p, i) for i, r in enumerate(_rows(p))] for s, p in files.items() if s != "train"}
        seen = {normalize(e["problem"]) for rows in evals.values() for e in rows}
        train = [_example(r, files["train"], i) for i, r in enumerate(_rows(files["train"]))]
        kept = [e for e in train if normalize(e["problem"]) not in seen]
        if len(kept) < len(train):
            print(f"math: dropped {len(train) - len(kept)} training problems that are in an evaluation set")
        return {"train": self._generate_examples(kept), **{s: self._generate_examples(r) for s, r in evals.items()}}

    def _generate_examples(self, rows: list[dict[str, str]]) -> Iterator[tuple[int, dict[str, str]]]:
        yield from enumerate(rows)


def fingerprint(manual_dir: str | Path) -> str:
    """A short hash of the problem files' names and contents: a changed file builds anew."""
    digest = hashlib.sha256()
    for split, path in sorted(find_files(manual_dir).items()):
        digest.update(f"{split}:{path.name}:".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def _builder(data_dir: str | Path, manual_dir: str | Path) -> MathProblems:
    return MathProblems(data_dir=str(Path(data_dir) / "math" / fingerprint(manual_dir)), file_format="array_record")


def build_problems(data_dir: str | Path, manual_dir: str | Path) -> list[str]:
    """Builds (once per content) the splits of manual_dir's files under data_dir; their names, train first."""
    builder = _builder(data_dir, manual_dir)
    prepare(builder, f"the math problems of {manual_dir}", tfds.download.DownloadConfig(manual_dir=str(manual_dir)))
    return ["train", *sorted(s for s in builder.info.splits if s != "train")]


def read_problems(data_dir: str | Path, manual_dir: str | Path, split: str) -> list[dict[str, str]]:
    """Every problem of one built split: {"id", "problem", "answer", "solution"}."""
    builder = _builder(data_dir, manual_dir)
    if not (Path(builder.data_dir) / "dataset_info.json").is_file():
        raise FileNotFoundError(f"the math problems of {manual_dir} are not built under {data_dir}; "
                                "call build_problems first (the math family does so on first use)")
    if split not in builder.info.splits:
        raise ValueError(f"no {split!r} split in {manual_dir}: it has {sorted(builder.info.splits)}")
    source = builder.as_data_source(split=split)
    text = lambda v: v.decode() if isinstance(v, bytes) else str(v)
    return [{k: text(np.asarray(ex[k]).item() if hasattr(ex[k], "shape") else ex[k]) for k in ex}
            for ex in (source[i] for i in range(len(source)))]
