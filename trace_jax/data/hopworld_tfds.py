"""TFDS builder for HopWorld questions (array_record files, no TensorFlow).

One BuilderConfig per world (`seed_0` .. `seed_4` registered with the default world size;
`builder_config(cfg)` makes one for any HopWorldConfig). Splits partition the world's question
ids: train 80%, validation 10%, test 10%. Build with `build_dataset(data_dir, cfg)`, read with
`read_split(data_dir, cfg, split)` or `tfds.data_source("hop_world/seed_0", data_dir=...)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from trace_jax.data.prepare import prepare
from trace_jax.envs.hopworld.config import HopWorldConfig
from trace_jax.envs.hopworld.world import World, build_world

NAME = "hop_world"
SPLIT_FRACTIONS = {"train": (0.0, 0.8), "validation": (0.8, 0.9), "test": (0.9, 1.0)}
BUILD_HINT = (
    "run `trace-jax data build --data-dir {data_dir}`"
    " (or trace_jax.data.hopworld_tfds.build_dataset)"
)


@dataclasses.dataclass(kw_only=True)
class HopWorldBuilderConfig(tfds.core.BuilderConfig):
    """A BuilderConfig carrying the HopWorldConfig fields that determine the questions."""

    seed: int = 0
    num_entities: int = HopWorldConfig.num_entities
    num_questions: int = HopWorldConfig.num_questions
    max_hops: int = HopWorldConfig.max_hops

    def world_config(self) -> HopWorldConfig:
        """A world with these questions (they do not depend on the episode limits, so those take defaults,
        with enough turns for the longest question)."""
        return HopWorldConfig(
            seed=self.seed, num_entities=self.num_entities,
            num_questions=self.num_questions, max_hops=self.max_hops,
            max_turns=max(HopWorldConfig.max_turns, self.max_hops + 1),
        )


def config_name(cfg: HopWorldConfig) -> str:
    """`seed_{s}` for the default world size, else `seed_{s}_e{E}_q{Q}_h{H}`."""
    default = HopWorldConfig(seed=cfg.seed)
    sizes = (cfg.num_entities, cfg.num_questions, cfg.max_hops)
    if sizes == (default.num_entities, default.num_questions, default.max_hops):
        return f"seed_{cfg.seed}"
    return f"seed_{cfg.seed}_e{cfg.num_entities}_q{cfg.num_questions}_h{cfg.max_hops}"


def builder_config(cfg: HopWorldConfig) -> HopWorldBuilderConfig:
    return HopWorldBuilderConfig(
        name=config_name(cfg), description=f"HopWorld questions of world {config_name(cfg)}",
        seed=cfg.seed, num_entities=cfg.num_entities, num_questions=cfg.num_questions,
        max_hops=cfg.max_hops,
    )


def split_ids(num_questions: int, split: str) -> np.ndarray:
    """Question ids of `split` ([n] int64): contiguous ranges of the world's questions."""
    lo, hi = SPLIT_FRACTIONS[split]
    return np.arange(round(lo * num_questions), round(hi * num_questions))


class HopWorld(tfds.core.GeneratorBasedBuilder):
    """Multi-hop questions over a generated HopWorld; answers are entity names."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    BUILDER_CONFIGS = [builder_config(HopWorldConfig(seed=s)) for s in range(5)]

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict({
                "question": tfds.features.Text(),
                "answer": tfds.features.Text(),
                "hops": np.int32,
                "question_id": np.int32,
                "world_seed": np.int32,
            }),
            supervised_keys=("question", "answer"),
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager) -> dict[str, Any]:
        world = build_world(self.builder_config.world_config())
        return {split: self._generate_examples(world, split) for split in SPLIT_FRACTIONS}

    def _generate_examples(self, world: World, split: str) -> Iterator[tuple[int, dict[str, Any]]]:
        for q in split_ids(world.num_questions, split).tolist():
            yield q, {
                "question": world.question_text(q),
                "answer": world.answer_text(q),
                "hops": int(world.hops[q]),
                "question_id": q,
                "world_seed": world.seed,
            }


def _builder(data_dir: str | Path, cfg: HopWorldConfig) -> HopWorld:
    name = config_name(cfg)  # registered configs must be passed by name
    config = name if name in HopWorld.builder_configs else builder_config(cfg)
    return HopWorld(data_dir=str(data_dir), config=config, file_format="array_record")


def build_dataset(data_dir: str | Path, cfg: HopWorldConfig) -> Path:
    """Generate the dataset of `cfg`'s world under `data_dir`; returns the version directory."""
    return prepare(_builder(data_dir, cfg), f"the HopWorld dataset (world seed {cfg.seed})")


def hopworld_source(data_dir: str | Path, cfg: HopWorldConfig, split: str):
    """One built split as a random-access source of examples (len, [i]), read from array_record on demand."""
    return _builder(data_dir, cfg).as_data_source(split=split)


def read_split(data_dir: str | Path, cfg: HopWorldConfig, split: str) -> list[dict[str, Any]]:
    """All examples of one split (dicts of numpy scalars / bytes), read and checked in full.

    Raises FileNotFoundError when the dataset was not built under `data_dir`, ValueError when
    its files are missing, truncated or unreadable.
    """
    if split not in SPLIT_FRACTIONS:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(SPLIT_FRACTIONS)}")
    builder = _builder(data_dir, cfg)
    version_dir = Path(builder.data_dir)
    if not (version_dir / "dataset_info.json").is_file():
        raise FileNotFoundError(
            f"HopWorld dataset {NAME}/{config_name(cfg)} not found at {version_dir}; "
            + BUILD_HINT.format(data_dir=data_dir)
        )
    try:
        source = builder.as_data_source(split=split)
        expected = builder.info.splits[split].num_examples
        if len(source) != expected:
            raise ValueError(f"{len(source)} records, dataset_info says {expected}")
        examples = [source[i] for i in range(len(source))]
        if any(ex["question_id"] is None or ex["question"] is None for ex in examples):
            raise ValueError("records without content")
    except Exception as err:  # array_record raises RuntimeError/ValueError/OSError variously
        raise ValueError(
            f"HopWorld dataset at {version_dir} is corrupt or incomplete ({split}: {err}); "
            f"delete {version_dir} and " + BUILD_HINT.format(data_dir=data_dir)
        ) from err
    return examples
