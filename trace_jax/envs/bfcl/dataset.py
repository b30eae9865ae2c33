"""BFCL entries through TFDS (array_record, no TensorFlow): each entry's id and subset, split train/eval.

The rows come from the installed bfcl-eval package's multi-turn JSON files (nothing is downloaded), all four
subsets; `data.split` assigns them by the seeded 80/20 split of the scenarios. A build is named by bfcl-eval's
version and the split seed (`build_entries` builds it once), `read_entries` reads a split back.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from trace_jax.data.prepare import prepare
from trace_jax.envs.bfcl.data import SUBSETS, load_entries, split

SPLITS = ("train", "eval")


class BfclEntries(tfds.core.GeneratorBasedBuilder):
    """BFCL v4 multi-turn entries (id, subset); the builder config's name is the split seed, `seed<k>`."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}

    def _info(self) -> tfds.core.DatasetInfo:
        text = tfds.features.Text()
        return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({"id": text, "subset": text}))

    def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict[str, Any]:
        entries = load_entries()
        subset_of = {e.id: e.subset for e in entries}
        train, evaluate = split(entries, int(self.builder_config.name.removeprefix("seed")))
        return {name: self._generate_examples([{"id": i, "subset": subset_of[i]} for i in ids])
                for name, ids in zip(SPLITS, (train, evaluate))}

    def _generate_examples(self, rows: list[dict[str, str]]) -> Iterator[tuple[int, dict[str, str]]]:
        yield from enumerate(rows)


def _builder(data_dir: str | Path, seed: int) -> BfclEntries:
    root = Path(data_dir) / "bfcl" / version("bfcl-eval")
    return BfclEntries(data_dir=str(root), config=tfds.core.BuilderConfig(name=f"seed{seed}"),
                       file_format="array_record")


def build_entries(data_dir: str | Path, seed: int) -> None:
    """Builds (once per bfcl-eval version and seed) the train and eval splits under data_dir."""
    prepare(_builder(data_dir, seed), f"the BFCL entries' train and eval splits (seed {seed})")


def read_entries(data_dir: str | Path, seed: int, split_name: str) -> list[dict[str, str]]:
    """Every row {"id", "subset"} of one built split ("train" or "eval"), in the package's order."""
    if split_name not in SPLITS:
        raise ValueError(f"no {split_name!r} split of the BFCL entries: use one of {SPLITS}")
    builder = _builder(data_dir, seed)
    if not (Path(builder.data_dir) / "dataset_info.json").is_file():
        raise FileNotFoundError(f"the BFCL entries (split seed {seed}) are not built under {data_dir}; call "
                                "build_entries first (the bfcl family does so on first use)")
    source = builder.as_data_source(split=split_name)
    text = lambda v: v.decode() if isinstance(v, bytes) else str(v)
    rows = [{k: text(np.asarray(ex[k]).item() if hasattr(ex[k], "shape") else ex[k]) for k in ex}
            for ex in (source[i] for i in range(len(source)))]
    return sorted(rows, key=lambda r: (SUBSETS.index(r["subset"]), int(r["id"].rsplit("_", 1)[1])))
