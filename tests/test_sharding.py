"""Mesh sharding on 8 host CPU devices (set in conftest): real placement, same numerics."""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tiny_qwen3 import write_tiny_qwen3
from trace_jax import sharding as shd
from trace_jax.config import MeshConfig
from trace_jax.models import KVCache, ModelConfig, from_pretrained
from trace_jax.sharding import device_grid

pytestmark = pytest.mark.all_devices  # meshes over the 8 host devices

CFG = ModelConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=8,
                  num_kv_heads=2, head_dim=16, rope_theta=1e4)


@pytest.fixture(scope="module")
def mesh():
    assert jax.device_count() == 8, "conftest must set --xla_force_host_platform_device_count=8"
    return shd.make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))


def test_mesh_config_fill_and_errors():
    assert MeshConfig(data=-1, fsdp=2, tensor=2).resolve(8) == (2, 2, 2)
    assert MeshConfig().resolve(8) == (8, 1, 1)
    with pytest.raises(ValueError, match="not divisible"):
        MeshConfig(data=-1, fsdp=3).resolve(8)
    with pytest.raises(ValueError, match="at most one"):
        MeshConfig(data=-1, fsdp=-1)
    with pytest.raises(ValueError, match="6 but 8 devices"):
        MeshConfig(data=3, fsdp=2, tensor=1).resolve(8)


def test_logical_spec_drops_axes_that_do_not_divide(mesh):
    assert shd.logical_spec(("embed", "kv_heads", "head_dim"), (64, 2, 16), mesh) == P("fsdp", "tensor", None)
    assert shd.logical_spec(("embed", "kv_heads", "head_dim"), (64, 1, 16), mesh) == P("fsdp", None, None)
    assert shd.logical_spec(("batch", None), (8, 3), mesh) == P(("data", "fsdp"), None)
    assert shd.logical_spec(("batch", None), (2, 3), mesh) == P("data", None)
    with pytest.raises(KeyError, match="no sharding rule"):
        shd.logical_spec(("bogus",), (4,), mesh)


def test_parameters_are_really_sharded(mesh):
    model = shd.init_policy(CFG, seed=0, mesh=mesh)
    q = model.layers[0].self_attn.q_proj[...]
    assert q.sharding.spec == P("fsdp", "tensor", None)
    assert q.addressable_shards[0].data.shape == (32, 4, 16)
    gate = model.layers[1].mlp.gate_proj[...]
    assert gate.sharding.spec == P("fsdp", "tensor")
    assert model.embed_tokens[...].sharding.spec == P("tensor", "fsdp")
    assert model.lm_head[...].sharding.spec == P("fsdp", "tensor")


def test_sharded_forward_matches_single_device(mesh):
    single = shd.init_policy(CFG, seed=0)
    sharded = shd.init_policy(CFG, seed=0, mesh=mesh)
    ids = jnp.asarray(np.random.RandomState(0).randint(0, CFG.vocab_size, (8, 12)))
    state, forward = shd.sharded_forward(sharded, mesh, ids.shape)
    out = forward(state, ids)
    assert out.logits.sharding.spec == P(("data", "fsdp"), None, None)
    ref = single(ids)
    np.testing.assert_allclose(out.logits, ref.logits, atol=1e-5)
    np.testing.assert_allclose(out.success, ref.success, atol=1e-6)


def test_from_pretrained_places_tensors_on_the_mesh(mesh, tmp_path):
    write_tiny_qwen3(tmp_path / "hf", vocab_size=128, hidden_size=64, num_attention_heads=8,
                     num_key_value_heads=2, head_dim=16)
    single = from_pretrained(tmp_path / "hf")
    sharded = from_pretrained(tmp_path / "hf", mesh=mesh)
    k = sharded.layers[0].self_attn.k_proj[...]
    assert k.sharding.spec == P("fsdp", "tensor", None) and len(k.sharding.device_set) == 8
    ids = jnp.arange(16).reshape(2, 8)
    state, forward = shd.sharded_forward(sharded, mesh, ids.shape)
    np.testing.assert_allclose(forward(state, ids).logits, single(ids).logits, atol=1e-5)


def test_cache_shardings_shard_rows_and_heads(mesh):
    cache = KVCache.init(CFG, batch=8, max_len=16)
    shardings = shd.cache_shardings(cache, mesh)
    placed = jax.device_put(cache, shardings)
    assert placed.k[0].sharding.spec == P(("data", "fsdp"), "tensor", None, None)
    assert placed.lengths.sharding.spec == P(("data", "fsdp"))


def test_multislice_device_grid_keeps_fsdp_and_tensor_inside_a_slice():
    """On 2 slices of 4 devices, the data axis alone crosses slices; a layout that would split an fsdp or tensor
    group across slices is refused with the numbers."""
    devices = [SimpleNamespace(id=i, slice_index=i // 4) for i in (4, 0, 5, 1, 6, 2, 7, 3)]  # interleaved order
    grid = device_grid(devices, (4, 1, 2))
    slice_of = np.vectorize(lambda d: d.slice_index)(grid)
    assert (slice_of[:2] == 0).all() and (slice_of[2:] == 1).all()
    assert [d.id for d in grid[:2].flat] == [0, 1, 2, 3]  # each slice keeps the devices' own order
    grid = device_grid(devices, (2, 2, 2))
    assert (np.vectorize(lambda d: d.slice_index)(grid) == np.array([0, 1])[:, None, None]).all()
    with pytest.raises(ValueError, match=r"8 devices on 2 slices: mesh.data=1 must be a multiple of the slice count"):
        device_grid(devices, (1, 4, 2))
    single = [SimpleNamespace(id=i) for i in range(8)]
    assert [d.id for d in device_grid(single, (2, 2, 2)).flat] == list(range(8))


def test_process_rows_read_from_own_shards_and_back():
    """to_process_rows reads any chosen rows from the shards (split by rows and by columns), from_process_rows
    assembles the global array from them: on one process every row is its own."""
    mesh = shd.make_mesh(MeshConfig(data=4, fsdp=1, tensor=2))
    x = np.arange(8 * 6, dtype=np.int32).reshape(8, 6)
    sharding = NamedSharding(mesh, P("data", "tensor"))
    placed = shd.put_global(x, sharding)
    rows = shd.process_rows(sharding, x.shape)
    np.testing.assert_array_equal(rows, np.arange(8))
    for some in (rows, np.array([1, 5, 6]), np.array([7])):
        np.testing.assert_array_equal(shd.to_process_rows(placed, some), x[some])
    back = shd.from_process_rows(shd.to_process_rows(placed, rows), rows, 8, sharding)
    assert back.sharding == sharding
    np.testing.assert_array_equal(np.asarray(back), x)


@pytest.mark.parametrize("axes, source, taken", [((8, 1, 1), 8, 16), ((2, 2, 2), 16, 32), ((4, 1, 2), 8, 8)])
def test_take_rows_copies_rows_around_the_ring_without_gathering_the_source(axes, source, taken):
    """`take_rows` on a mesh splitting the rows gives `jnp.take`'s rows (repeats, every owner, rows a device keeps
    and rows from each other device) with the source never whole on a device: the compiled program passes shards
    around the batch axes' ring (collective permutes) and all-gathers nothing. Whichever way the ring turns or a
    shard is indexed wrong, some row comes from the wrong device."""
    mesh = shd.make_mesh(MeshConfig(*axes))
    cache = KVCache.init(CFG, batch=source, max_len=8)
    keys = jax.random.split(jax.random.key(0), 2 * len(cache.k) + 1)
    cache = KVCache(k=tuple(jax.random.normal(k, x.shape) for k, x in zip(keys, cache.k)),
                    v=tuple(jax.random.normal(k, x.shape) for k, x in zip(keys[len(cache.k):], cache.v)),
                    lengths=jax.random.randint(keys[-1], (source,), 0, 8))
    rows = jax.random.randint(jax.random.key(1), (taken,), 0, source).at[:source].set(jnp.arange(source)[::-1])
    placed = jax.device_put(cache, shd.cache_shardings(cache, mesh))
    at = jax.device_put(rows, shd.batch_sharding(rows.shape, mesh))
    take = jax.jit(lambda c, r: shd.constrain_rows(shd.take_rows(c, r, mesh), mesh))
    got = take(placed, at)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(cache)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b)[np.asarray(rows)])
    hlo = take.lower(placed, at).compile().as_text()
    assert "collective-permute" in hlo and "all-gather" not in hlo
    # unsplit (no mesh, or a source the batch axes split otherwise) it is jnp.take
    plain = shd.take_rows(cache, rows, None)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(cache)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b)[np.asarray(rows)])
