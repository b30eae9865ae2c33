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
from trace_jax.models import KVCache, ModelConfig
from trace_jax.models.hf_io import from_pretrained
from trace_jax.sharding import device_grid
from float32 import assert_float32_close

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
    assert_float32_close(out.logits, ref.logits)  # sharded matmuls sum in another order
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
    assert_float32_close(forward(state, ids).logits, single(ids).logits)


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
