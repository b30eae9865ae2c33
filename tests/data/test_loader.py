"""Prompt loader: fixed shapes, determinism in (seed, step), exact resume."""

import numpy as np
import pytest

from trace_jax.data.loader import PromptLoader, hopworld_loader
from trace_jax.envs.hopworld import protocol


def _equal(a, b) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_fixed_shapes_and_prompts(data_dir, small_cfg, small_world):
    loader = hopworld_loader(data_dir, small_cfg, "train", batch_size=16, seed=0)
    for _ in range(12):  # crosses epoch boundaries (160 examples)
        batch = next(loader)
        assert batch["prompt_ids"].shape == (16, small_cfg.prompt_len)
        assert all(batch[k].shape == (16,) for k in ("prompt_len", "question_id", "hops"))
        assert all(v.dtype == np.int32 for v in batch.values())
        rows = zip(batch["prompt_ids"], batch["prompt_len"], batch["question_id"], batch["hops"])
        for ids, n, q, h in rows:
            assert ids[:n].tolist() == protocol.prompt_ids(small_world.question_ids(q))
            assert (ids[n:] == protocol.PAD).all() and h == small_world.hops[q]


def test_epochs_cover_split_once(data_dir, small_cfg):
    loader = hopworld_loader(data_dir, small_cfg, "train", batch_size=20, seed=3)
    ids = np.concatenate([next(loader)["question_id"] for _ in range(len(loader) // 20)])
    assert sorted(ids.tolist()) == sorted(loader.question_ids.tolist())


def test_deterministic_and_seed_dependent(data_dir, small_cfg):
    a = hopworld_loader(data_dir, small_cfg, "train", batch_size=8, seed=1)
    b = hopworld_loader(data_dir, small_cfg, "train", batch_size=8, seed=1)
    c = hopworld_loader(data_dir, small_cfg, "train", batch_size=8, seed=2)
    batches_a = [next(a) for _ in range(30)]
    assert all(_equal(x, next(b)) for x in batches_a)
    assert not all(_equal(x, c.batch(i)) for i, x in enumerate(batches_a))
    unshuffled = hopworld_loader(data_dir, small_cfg, "train", batch_size=8, seed=1, shuffle=False)
    assert np.all(np.diff(unshuffled.batch(0)["question_id"]) > 0)


def test_resume_from_saved_position(data_dir, small_cfg):
    loader = hopworld_loader(data_dir, small_cfg, "validation", batch_size=6, seed=5)
    for _ in range(7):
        next(loader)
    saved = dict(loader.state())
    expected = [next(loader) for _ in range(5)]
    resumed = hopworld_loader(data_dir, small_cfg, "validation", batch_size=6, seed=5)
    resumed.restore(saved)
    assert all(_equal(x, next(resumed)) for x in expected)
    with pytest.raises(ValueError, match="seed"):
        hopworld_loader(data_dir, small_cfg, "validation", batch_size=6, seed=6).restore(saved)


def test_prompt_too_long():
    ex = {"question": b"what is the ceo of Lumeco Labs ?", "question_id": 0, "hops": 1}
    with pytest.raises(ValueError, match="prompt_len"):
        PromptLoader([ex], batch_size=2, prompt_len=4, seed=0)


def test_a_process_share_of_rows_is_those_rows_of_the_batch(data_dir, small_cfg):
    loader = hopworld_loader(data_dir, small_cfg, "train", batch_size=16, seed=2)
    for step in (0, 9):  # step 9 straddles an epoch boundary (160 examples)
        full = loader.batch(step)
        for rows in (np.arange(8), np.arange(8, 16), np.array([1, 5, 15])):
            part = loader.batch(step, rows)
            assert _equal(part, {k: v[rows] for k, v in full.items()})


def test_grain_pipeline_of_the_loader_benchmark(data_dir, small_cfg, capsys):
    """What `bench loader` times against the loader: rows of each pool, a pure function of (seed, step), every
    prompt once per epoch, tokenized like the loader's."""
    from trace_jax.bench.loader import grain_batches, run_loader_bench

    loader = hopworld_loader(data_dir, small_cfg, "train", batch_size=16, seed=0, shuffle=False)
    batches = grain_batches(str(data_dir), small_cfg, 16, seed=1, rows=np.arange(16))
    epoch = np.concatenate([batches(step) for step in range(len(loader) // 16)])
    np.testing.assert_array_equal(batches(3), epoch[48:64])
    assert sorted(map(tuple, epoch.tolist())) == sorted(map(tuple, loader.prompt_ids.tolist()))
    assert batches(0).tolist() != grain_batches(str(data_dir), small_cfg, 16, seed=2, rows=np.arange(16))(0).tolist()
    out = run_loader_bench(str(data_dir), small_cfg, batch_size=16, processes=2, steps=3)
    assert out["loader_batches_per_s"] > 0 and out["grain_batches_per_s"] > 0
    assert "loader / grain" in capsys.readouterr().out
