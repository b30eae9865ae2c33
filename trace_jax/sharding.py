"""Device mesh, logical-axis rules, and the shardings of parameters, KV caches and batches; global arrays built
from each process's share (several processes) and gathered back to numpy.

Parameters name their logical axes in `axes` metadata (see `models/qwen3.py`); `RULES` maps each
logical axis to mesh axes. A mesh axis that does not divide a dimension is dropped for that
dimension (e.g. one KV head on a tensor axis of 2 stays replicated), so any config shards.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from trace_jax.config import MeshConfig
from trace_jax.models.cache import KVCache
from trace_jax.models.config import ModelConfig
from trace_jax.models.qwen3 import ModelOutput, Policy

AXES = ("data", "fsdp", "tensor")
Rules = dict[str, tuple[str, ...]]

RULES: Rules = {
    # parameters
    "vocab": ("tensor",),
    "embed": ("fsdp",),
    "q_heads": ("tensor",),
    "kv_heads": ("tensor",),
    "mlp": ("tensor",),
    "head_dim": (),
    "norm": (),
    # activations and caches
    "batch": ("data", "fsdp"),
    "seq": (),
    "cache_seq": (),
}


def make_mesh(cfg: MeshConfig = MeshConfig(), devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh with classic GSPMD (Auto) axes over `devices` (default: all); on several TPU
    slices only the data axis crosses them (`device_grid`)."""
    devices = list(jax.devices()) if devices is None else list(devices)
    grid = device_grid(devices, cfg.resolve(len(devices)))
    return Mesh(grid, AXES, axis_types=(AxisType.Auto,) * len(AXES))


def device_grid(devices: Sequence, shape: tuple[int, int, int]) -> np.ndarray:
    """`devices` laid out as a (data, fsdp, tensor) array. Devices of several slices (TPU multislice: the
    `slice_index` of each) are grouped by slice along the data axis, so fsdp and tensor groups stay inside a
    slice (its fast interconnect) and only the data axis's gradient reduction crosses the data-center network;
    within a slice, the order of `devices`."""
    slices = sorted({getattr(d, "slice_index", 0) for d in devices})
    if len(slices) == 1:
        return np.asarray(devices, dtype=object).reshape(shape)
    data, fsdp, tensor = shape
    per_slice = len(devices) // len(slices)
    if data % len(slices) or any(sum(getattr(d, "slice_index", 0) == s for d in devices) != per_slice
                                 for s in slices):
        raise ValueError(f"{len(devices)} devices on {len(slices)} slices: mesh.data={data} must be a multiple of "
                         f"the slice count and every slice must bring the same number of devices, so that only the "
                         f"data axis crosses slices (set mesh.fsdp * mesh.tensor to divide {per_slice})")
    ordered = sorted(devices, key=lambda d: getattr(d, "slice_index", 0))  # stable: each slice's own order
    return np.asarray(ordered, dtype=object).reshape(len(slices), data // len(slices), fsdp, tensor).reshape(shape)


def logical_spec(axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                 rules: Rules | None = None) -> PartitionSpec:
    """PartitionSpec for an array of `shape` whose dimensions have logical names `axes`."""
    rules = RULES if rules is None else rules
    if len(axes) != len(shape):
        raise ValueError(f"logical axes {tuple(axes)} do not match shape {tuple(shape)}")
    used: set[str] = set()
    spec = []
    for name, dim in zip(axes, shape):
        if name is not None and name not in rules:
            raise KeyError(f"logical axis {name!r} has no sharding rule; known: {sorted(rules)}")
        mesh_axes = []
        size = 1
        for ax in rules.get(name, ()) if name is not None else ():
            n = mesh.shape[ax]
            if n > 1 and ax not in used and dim % (size * n) == 0:
                mesh_axes.append(ax)
                size *= n
        used.update(mesh_axes)
        spec.append(tuple(mesh_axes) if len(mesh_axes) > 1 else (mesh_axes[0] if mesh_axes else None))
    return PartitionSpec(*spec)


def param_shardings(state: nnx.State, mesh: Mesh, rules: Rules | None = None) -> nnx.State:
    """A state of NamedShardings mirroring `state` (abstract or concrete), from each param's axes."""
    def one(var: nnx.Variable) -> nnx.Variable:
        value = var.get_value()
        axes = var.get_metadata().get("axes")
        if axes is None:
            axes = (None,) * len(value.shape)
        return var.replace(NamedSharding(mesh, logical_spec(axes, value.shape, mesh, rules)))

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def cache_shardings(cache: KVCache, mesh: Mesh, rules: Rules | None = None) -> KVCache:
    """Rows over (data, fsdp), KV heads over tensor; lengths follow the rows."""
    kv = NamedSharding(mesh, logical_spec(KVCache.AXES, cache.k[0].shape, mesh, rules))
    rows = NamedSharding(mesh, logical_spec(("batch",), cache.lengths.shape, mesh, rules))
    return KVCache(k=tuple(kv for _ in cache.k), v=tuple(kv for _ in cache.v), lengths=rows)


def batch_sharding(shape: Sequence[int], mesh: Mesh, rules: Rules | None = None) -> NamedSharding:
    """Leading dimension over the batch axes, the rest replicated."""
    axes = ("batch",) + (None,) * (len(shape) - 1)
    return NamedSharding(mesh, logical_spec(axes, shape, mesh, rules))


def data_parallel_size(mesh: Mesh | None, rules: Rules | None = None) -> int:
    """Devices the rows (slots) of a batch are split over: the product of the batch axes' sizes (1 without a mesh)."""
    if mesh is None:
        return 1
    return int(np.prod([mesh.shape[ax] for ax in (RULES if rules is None else rules)["batch"]]))


def constrain_rows(tree, mesh: Mesh | None, rules: Rules | None = None):
    """Inside jit: every array leaf [rows, ...] of `tree` split by rows over the batch axes (KV caches: heads
    over tensor too); scalars stay replicated. The identity without a mesh."""
    if mesh is None:
        return tree

    def one(x):
        if isinstance(x, KVCache):
            return jax.lax.with_sharding_constraint(x, cache_shardings(x, mesh, rules))
        if x.ndim == 0:
            return x
        return jax.lax.with_sharding_constraint(x, batch_sharding(x.shape, mesh, rules))

    return jax.tree.map(one, tree, is_leaf=lambda x: isinstance(x, KVCache))


def constrain_vocab(logits: jax.Array, mesh: Mesh | None, rules: Rules | None = None) -> jax.Array:
    """Inside jit: logits [rows, positions, V] split by rows over the batch axes and by vocabulary over the tensor
    axis, as the LM head's weights are, so the loss's softmax reduces across devices instead of gathering the
    whole vocabulary on each. The identity without a mesh."""
    if mesh is None:
        return logits
    spec = logical_spec(("batch", "seq", "vocab"), logits.shape, mesh, rules)
    return jax.lax.with_sharding_constraint(logits, NamedSharding(mesh, spec))


def init_policy(cfg: ModelConfig, seed: int, mesh: Mesh | None = None, rules: Rules | None = None) -> Policy:
    """A randomly initialised policy whose parameters are created directly on their shardings."""
    if mesh is None:
        return Policy(cfg, nnx.Rngs(seed))
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Policy(cfg, nnx.Rngs(seed))))
    shardings = param_shardings(abstract, mesh, rules)
    state = jax.jit(lambda: nnx.split(Policy(cfg, nnx.Rngs(seed)))[1], out_shardings=shardings)()
    return nnx.merge(graphdef, state)


def sharded_forward(model: Policy, mesh: Mesh, batch_shape: tuple[int, int], rules: Rules | None = None):
    """(state, fn) where fn(state, input_ids [rows, positions]) -> ModelOutput is jitted with explicit
    in/out shardings: params on their rules, batch rows over (data, fsdp)."""
    graphdef, state = nnx.split(model)
    b, t = batch_shape
    rows = lambda *shape: batch_sharding(shape, mesh, rules)
    out_shardings = ModelOutput(logits=rows(b, t, model.cfg.vocab_size), hidden=rows(b, t, model.cfg.hidden_size),
                                success=rows(b, t), cache=None, predictor_hidden=rows(b, t, model.cfg.hidden_size))

    @functools.partial(jax.jit, in_shardings=(param_shardings(state, mesh, rules), rows(b, t)),
                       out_shardings=out_shardings)
    def forward(state, input_ids):
        return nnx.merge(graphdef, state)(input_ids)

    return state, forward


def process_rows(sharding: jax.sharding.Sharding, shape: Sequence[int]) -> np.ndarray:
    """The rows (sorted indices into the leading dimension) of a global array of `shape` on `sharding` that this
    process's devices hold: all of them when rows are replicated, 1/P of them when split over P processes."""
    rows = np.arange(shape[0])
    return np.unique(np.concatenate([rows[index[0]] for index in
                                     sharding.addressable_devices_indices_map(tuple(shape)).values()]))


def from_process_rows(local: np.ndarray, rows: np.ndarray, num_rows: int,
                      sharding: jax.sharding.Sharding) -> jax.Array:
    """The global array [num_rows, ...] on `sharding` whose rows `rows` (= `process_rows`) this process holds as
    `local` [len(rows), ...]; each process passes its own rows, no data crosses processes."""
    position = np.full(num_rows, -1)
    position[rows] = np.arange(len(rows))

    def shard(index: tuple[slice, ...]) -> np.ndarray:
        at = position[np.arange(num_rows)[index[0]]]
        if (at < 0).any():
            raise ValueError(f"a device of this process needs rows {np.arange(num_rows)[index[0]]}, not all loaded")
        return local[(at, *index[1:])]

    return jax.make_array_from_callback((num_rows, *local.shape[1:]), sharding, shard)


def to_process_rows(x: jax.Array, rows: np.ndarray) -> np.ndarray:
    """Rows `rows` (= `process_rows`) of the global array x [R, ...] as numpy [len(rows), ...], read from this
    process's own shards: no data crosses processes (`to_host` gathers every row to every process)."""
    out = np.empty((len(rows), *x.shape[1:]), x.dtype)
    position = np.full(x.shape[0], -1)
    position[rows] = np.arange(len(rows))
    for shard in x.addressable_shards:
        at = position[np.arange(x.shape[0])[shard.index[0]]]
        keep = at >= 0
        out[(at[keep], *shard.index[1:])] = np.asarray(shard.data)[keep]
    return out


def put_global(tree, shardings):
    """Each leaf of `tree` (the same value on every process) on its sharding in `shardings` (a matching tree); each
    process copies only the shards its devices hold."""
    def one(x, sharding: jax.sharding.Sharding) -> jax.Array:
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    return jax.tree.map(one, tree, shardings)


def rows_on(tree, mesh: Mesh | None, rules: Rules | None = None):
    """Each array leaf of `tree` (the same value on every process) with its rows split over `mesh`'s batch axes
    (`batch_sharding`); each process copies only the rows its devices hold. mesh None: on the default device."""
    if mesh is None:
        return jax.tree.map(jax.numpy.asarray, tree)
    return put_global(tree, jax.tree.map(lambda x: batch_sharding(np.shape(x), mesh, rules), tree))


def to_host(tree):
    """Every array leaf of `tree` as numpy, gathered from all processes when it spans several."""
    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(jax.device_get(x))

    return jax.tree.map(one, tree)
