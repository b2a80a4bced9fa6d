"""Device mesh, the logical-axis table, and the shardings of parameters and batches.

Parallelism is declared as data. Parameters carry *logical* axis names (``vocab``, ``embed``,
``mlp``, ``heads``, ``head_dim``, ``memory``; see the contract in ``titans_lm/models``), set with
``nnx.with_partitioning``. One table, :data:`LOGICAL_AXIS_RULES` (defined in ``titans_lm.nn.axes``),
maps each logical name to a mesh axis; the mesh has three axes:

- ``data``: pure data parallelism (parameters replicated, batch split);
- ``fsdp``: the batch is split *and* parameters are sharded along their ``embed`` axis
  (ZeRO-3 style; XLA all-gathers them for each use and reduce-scatters the gradients);
- ``tensor``: Megatron-style tensor parallelism over ``vocab``/``mlp``/``heads``.

The mesh uses ``AxisType.Auto`` axes (the GSPMD style): the step is jitted with in/out shardings
and the compiler propagates the shardings of the intermediates. Fallbacks keep every parameter
legal: a logical name mapped to an axis that does not divide that dimension, or to an axis
already used by an earlier dimension of the same parameter, leaves that dimension replicated; a
parameter whose annotation does not match its rank is replicated whole.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from titans_lm.nn.axes import BATCH_AXES, LOGICAL_AXIS_RULES, MESH_AXES

_log = logging.getLogger(__name__)


def mesh_shape(mesh_cfg: Mapping[str, int], n_devices: int) -> tuple[int, int, int]:
    """Resolve the ``(data, fsdp, tensor)`` sizes of ``mesh_cfg`` for ``n_devices`` devices.

    At most one axis may be -1; it takes the devices the other axes leave. Without a -1 the
    product may be smaller than ``n_devices`` (the mesh then uses the first devices only).

    Raises:
      ValueError: more than one -1, fixed sizes that do not divide ``n_devices``, or a product
        larger than ``n_devices``.
    """
    sizes = [int(mesh_cfg[a]) for a in MESH_AXES]
    free = [a for a, s in zip(MESH_AXES, sizes) if s == -1]
    if len(free) > 1:
        raise ValueError(f"mesh: at most one axis may be -1, got {dict(zip(MESH_AXES, sizes))}")
    fixed = math.prod(s for s in sizes if s != -1)
    if free:
        if n_devices % fixed:
            raise ValueError(f"mesh: the fixed axes {dict(zip(MESH_AXES, sizes))} use {fixed} devices, "
                             f"which does not divide the {n_devices} available")
        sizes[MESH_AXES.index(free[0])] = n_devices // fixed
    elif fixed > n_devices:
        raise ValueError(f"mesh: data*fsdp*tensor = {fixed} but there are only {n_devices} devices")
    return tuple(sizes)  # type: ignore[return-value]


def make_mesh(mesh_cfg: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``(data, fsdp, tensor)`` mesh with Auto axes over ``devices`` (default: all devices;
    a mesh smaller than the device list takes its first devices).

    Raises:
      ValueError: see :func:`mesh_shape`.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(mesh_cfg, len(devices))
    if math.prod(shape) < len(devices):
        _log.warning("mesh %s uses %d of the %d devices", shape, math.prod(shape), len(devices))
        devices = devices[:math.prod(shape)]
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                         devices=devices)


def logical_to_mesh_spec(logical: Sequence[str | None] | None, shape: Sequence[int], mesh: Mesh,
                         rules: Sequence[tuple[str, str | None]] = LOGICAL_AXIS_RULES) -> P:
    """Map one parameter's logical axis names to a mesh ``PartitionSpec`` (with the fallbacks).

    Args:
      logical: one name (or None) per dimension, or None for an unannotated parameter.
      shape: the parameter's shape.
      mesh: the device mesh.
      rules: (logical name, mesh axis or None) pairs.

    Raises:
      ValueError: a logical name that the rules do not know.
    """
    if not logical:
        return P()
    table = dict(rules)
    if len(logical) != len(shape):
        _log.warning("parameter of shape %s annotated with %s (rank differs): replicated",
                     tuple(shape), tuple(logical))
        return P()
    out, used = [], set()
    for name, dim in zip(logical, shape):
        if name is None:
            out.append(None)
            continue
        if name not in table:
            raise ValueError(f"logical axis name {name!r} has no rule; known names: {sorted(table)}")
        axis = table[name]
        if axis is None or mesh.shape[axis] == 1 or axis in used or dim % mesh.shape[axis]:
            out.append(None)
            continue
        used.add(axis)
        out.append(axis)
    return P(*out)


def param_logical_axes(state: nnx.State) -> Any:
    """The logical names of each parameter of an ``nnx.State``, as a pure-dict tree.

    Each leaf is a ``PartitionSpec`` of *logical* names (not yet mesh axes), ``P()`` for a
    parameter without ``nnx.with_partitioning`` metadata. Read outside any
    ``nnx.logical_axis_rules`` context, so the names come back unresolved.
    """
    return nnx.to_pure_dict(nnx.get_partition_spec(state))


def param_shardings(abstract_params: Any, logical_axes: Any, mesh: Mesh) -> Any:
    """NamedSharding tree for a pure-dict parameter tree.

    Args:
      abstract_params: pure-dict tree of arrays or ``jax.ShapeDtypeStruct``.
      logical_axes: the matching tree of logical ``PartitionSpec`` (:func:`param_logical_axes`).
      mesh: the device mesh.
    """
    return jax.tree.map(
        lambda x, names: NamedSharding(mesh, logical_to_mesh_spec(tuple(names), x.shape, mesh)),
        abstract_params, logical_axes)


def replicated(mesh: Mesh) -> NamedSharding:
    """Sharding of a value held whole on every device (scalars, RNG keys, counters)."""
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding of a ``[B, ...]`` batch: B split over ``data`` x ``fsdp``."""
    return NamedSharding(mesh, P(BATCH_AXES))


def batch_divisor(mesh: Mesh) -> int:
    """The number of batch shards; per-step (micro-)batches must be a multiple of it."""
    return mesh.shape["data"] * mesh.shape["fsdp"]


def put_batch(batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Assemble this process's numpy batch into global arrays sharded over the batch axes.

    On one host this is a sharded ``device_put``; on several, each host passes its own rows
    (its shard of the global batch) and the result is the global batch.
    """
    sharding = batch_sharding(mesh)
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
            for k, v in batch.items()}


def process_rows(batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """This process's contiguous share of a batch that every process built whole: block
    ``jax.process_index()`` of ``jax.process_count()`` blocks along the rows (the whole batch
    in a single process)."""
    p, n = jax.process_index(), jax.process_count()
    return {k: np.array_split(np.asarray(v), n)[p] for k, v in batch.items()}


def put_global_batch(batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """:func:`put_batch` of a batch that every process built whole (evaluation and validation
    batches): each process passes its own rows (:func:`process_rows`), the result is ``batch``
    as one global array per key, sharded over the batch axes."""
    return put_batch(process_rows(batch), mesh)


def traced_under(mesh: Mesh, fn: Callable) -> Callable:
    """``fn`` traced with ``mesh`` as JAX's current abstract mesh.

    ``jax.jit`` with in/out shardings does not set a mesh context, so code inside the step that
    asks for the mesh (``jax.sharding.get_abstract_mesh()``; the memory layer does, to run its
    Pallas kernels per shard, ``titans_lm.memory.sharded``) would see none. Wrap a step function
    with this before jitting it: tracing then happens under
    ``jax.sharding.use_abstract_mesh(mesh.abstract_mesh)``, allowed inside ``jax.jit``.
    """
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(*args, **kwargs)
    return wrapped

