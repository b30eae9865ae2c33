"""TFDS builder for the Search-R1 / FlashRAG QA datasets, from local files (array_record, no TensorFlow).

One BuilderConfig per dataset: nq, triviaqa, popqa, hotpotqa, 2wikimultihopqa, musique, bamboogle. The
files are read from `manual_dir/<dataset>/<split>.{jsonl,parquet}` for the splits train, dev and test
(whichever exist); each row needs `question` and `golden_answers` (a list of strings, or one string);
`data_source` and `id` are kept when present. Build with `build_qa(data_dir, manual_dir, dataset)`,
read with `read_qa(data_dir, dataset, split)`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import tensorflow_datasets as tfds

from trace_jax.data.prepare import prepare
from trace_jax.envs.search_qa.config import DATASETS

NAME = "search_qa"
SPLITS = ("train", "dev", "test")
FORMATS = ("jsonl", "parquet")


def expected_files(manual_dir: str | Path, dataset: str) -> list[Path]:
    return [Path(manual_dir) / dataset / f"{split}.{fmt}" for split in SPLITS for fmt in FORMATS]


def _files(manual_dir: Path, dataset: str) -> dict[str, Path]:
    """{split: file} of the splits present (jsonl before parquet); an error listing what it looked for."""
    found = {}
    for split in SPLITS:
        for fmt in FORMATS:
            path = manual_dir / dataset / f"{split}.{fmt}"
            if split not in found and path.is_file():
                found[split] = path
    if not found:
        listing = "\n  ".join(str(p) for p in expected_files(manual_dir, dataset))
        raise FileNotFoundError(
            f"no {dataset} files in {manual_dir / dataset}; expected one or more of:\n  {listing}\n"
            "Put the Search-R1 / FlashRAG files there (rows with `question` and `golden_answers`), or pass "
            "the folder that holds them as manual_dir")
    return found


def _rows(path: Path) -> Iterator[dict[str, Any]]:
    if path.suffix == ".parquet":
        yield from pq.read_table(path).to_pylist()
        return
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{lineno}: not JSON ({e.msg})") from None


def _example(row: Any, path: Path, i: int, dataset: str) -> dict[str, Any]:
    golds = row.get("golden_answers") if isinstance(row, dict) else None
    golds = [golds] if isinstance(golds, str) else golds
    if hasattr(golds, "tolist"):
        golds = golds.tolist()
    if not isinstance(row.get("question") if isinstance(row, dict) else None, str) or not isinstance(golds, list) \
            or not golds or not all(isinstance(g, str) for g in golds):
        raise ValueError(f"{path} row {i}: needs a string `question` and a non-empty list of strings "
                         "`golden_answers`")
    return {"id": str(row.get("id", i)), "question": row["question"], "golden_answers": golds,
            "data_source": str(row.get("data_source") or dataset)}


class SearchQa(tfds.core.GeneratorBasedBuilder):
    """Open-domain and multi-hop QA in the Search-R1 format."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=d, description=f"{d} in the Search-R1 format") for d in DATASETS]
    MANUAL_DOWNLOAD_INSTRUCTIONS = (
        "Place <dataset>/<split>.jsonl or .parquet (splits train, dev, test) under manual_dir, e.g. the files "
        "of Search-R1's or FlashRAG's QA collections.")

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({
            "id": tfds.features.Text(),
            "question": tfds.features.Text(),
            "golden_answers": tfds.features.Sequence(tfds.features.Text()),
            "data_source": tfds.features.Text(),
        }))

    def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict[str, Any]:
        files = _files(Path(dl_manager.manual_dir), self.builder_config.name)
        return {split: self._generate_examples(path) for split, path in files.items()}

    def _generate_examples(self, path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
        for i, row in enumerate(_rows(path)):
            yield i, _example(row, path, i, self.builder_config.name)


def _check(dataset: str) -> None:
    if dataset not in DATASETS:
        raise ValueError(f"unknown QA dataset {dataset!r}; expected one of {', '.join(DATASETS)}")


def build_qa(data_dir: str | Path, manual_dir: str | Path, dataset: str) -> Path:
    """Build `dataset` from the files in manual_dir (see the module docstring); returns its version folder."""
    _check(dataset)
    _files(Path(manual_dir), dataset)  # the clear error before TFDS's own
    builder = SearchQa(data_dir=str(data_dir), config=dataset, file_format="array_record")
    return prepare(builder, f"the {dataset} questions of {manual_dir}",
                   tfds.download.DownloadConfig(manual_dir=str(manual_dir)))


def read_qa(data_dir: str | Path, dataset: str, split: str) -> list[dict[str, Any]]:
    """Every example of one split: {"id", "question", "golden_answers": [str], "data_source"} as Python strings."""
    _check(dataset)
    builder = SearchQa(data_dir=str(data_dir), config=dataset, file_format="array_record")
    if not (Path(builder.data_dir) / "dataset_info.json").is_file():
        raise FileNotFoundError(f"QA dataset {NAME}/{dataset} is not built under {data_dir}; build it with "
                                "trace_jax.data.search_qa_tfds.build_qa (the search QA configs do so on first use)")
    if split not in builder.info.splits:
        raise ValueError(f"{dataset} has no {split!r} split; it has {sorted(builder.info.splits)}")
    source = builder.as_data_source(split=split)
    text = lambda v: v.decode() if isinstance(v, bytes) else str(v)
    return [{"id": text(ex["id"]), "question": text(ex["question"]),
             "golden_answers": [text(g) for g in np.atleast_1d(ex["golden_answers"])],
             "data_source": text(ex["data_source"])} for ex in (source[i] for i in range(len(source)))]
