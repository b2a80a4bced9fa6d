"""The mesh axes and the one sharding table: which mesh axis each logical parameter axis uses.

Parameters carry *logical* axis names (``vocab``, ``embed``, ``mlp``, ``heads``, ``head_dim``,
``memory``), set with ``nnx.with_partitioning`` by the layers. :data:`LOGICAL_AXIS_RULES` maps
each name to one of the mesh axes :data:`MESH_AXES` (or to none: replicated); batches are split
over :data:`BATCH_AXES`. The table is data at the bottom of the package so that the layers that
need it (the memory engine's per-shard run, ``titans_lm.memory.sharded``) and the code that
builds meshes and shardings (``titans_lm.train.sharding``) read the same one.
"""

from __future__ import annotations

MESH_AXES = ("data", "fsdp", "tensor")

# The one sharding table: logical parameter axis -> mesh axis (None: replicated).
# "head_dim" stays whole so each head's q/k/v live on one device; "memory" (the inner-loop
# memory's own hidden axes) stays whole because the memory is updated chunk by chunk inside a
# scan, where a sharded hidden axis would cost collectives at every chunk.
LOGICAL_AXIS_RULES: tuple[tuple[str, str | None], ...] = (
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("head_dim", None),
    ("memory", None),
)

# Every logical name a parameter may carry.
AXIS_NAMES = frozenset(name for name, _ in LOGICAL_AXIS_RULES)

# The batch dimension is split over both data-parallel axes.
BATCH_AXES = ("data", "fsdp")

__all__ = ["AXIS_NAMES", "BATCH_AXES", "LOGICAL_AXIS_RULES", "MESH_AXES"]
