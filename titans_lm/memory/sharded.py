"""The memory engine per shard of the device mesh: ``jax.shard_map`` over batch rows and heads.

The engine is independent per (batch row, head) (the layer vmaps it over the batch x head rows;
docs/design.md#implementations-one-contract), so a mesh that splits the batch over ``data`` x
``fsdp`` and the memory heads over ``tensor`` (``titans_lm.nn.axes``: ``BATCH_AXES`` and the
``heads`` rule) can run it on each device's own rows and heads with no communication. That matters for the Pallas kernels
(``impl="pallas"``, and ``"auto"`` where it picks them): a compiled ``pallas_call`` is a custom
call that XLA's SPMD partitioner cannot split, so under plain ``jax.jit`` with sharded inputs the
compiler gathers the whole batch and every head onto each device and runs the full kernel there
(and in Pallas' CPU interpreter it partitions the interpreted loops with extra collectives).
:func:`run_engine` wraps the layer's vmapped engine in ``jax.shard_map`` instead, so each device
calls the kernel on its local block, exactly as it would without a mesh.

The mesh is JAX's current abstract mesh (``jax.sharding.get_abstract_mesh()``), which
``jax.set_mesh`` or ``jax.sharding.use_abstract_mesh`` sets; the jitted train and eval steps
trace under their mesh (``titans_lm.train.sharding.traced_under``). No mesh, or a mesh of one
device: the engine is called directly, as before. The ``chunked`` and ``reference`` engines are
always called directly (they are plain XLA code that the partitioner splits by itself).

Fallback (chosen over an error so that every config that trains with ``chunked`` also trains with
``pallas``, as the parameter rules do for dimensions an axis does not divide): a batch axis that
does not divide the batch (given the axes kept before it), or a ``tensor`` axis that does not divide
``MemoryConfig.n_heads``, is left out of that dimension's split: the engine then runs on the whole
dimension on each device along that axis (correct, duplicated work), and a warning naming the
config fields (``train.batch_size`` / ``train.grad_accum``, ``model.memory.n_heads``, ``mesh.*``)
is logged once per distinct reason.

The PartitionSpecs are data: :data:`ENGINE_OPERANDS` and :data:`ENGINE_RESULTS` give each operand
and result of the vmapped engine a layout kind, :func:`layout_specs` turns the kinds into specs
for a :class:`ShardPlan`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh, PartitionSpec as P

from titans_lm.logs import warn_once
from titans_lm.nn.axes import BATCH_AXES, LOGICAL_AXIS_RULES

_log = logging.getLogger(__name__)

# Mesh axes the memory heads are split over: the "heads" rule of the parameter table.
HEAD_AXES: tuple[str, ...] = tuple(a for a in (dict(LOGICAL_AXIS_RULES)["heads"],) if a)

# Layout kinds: "row_head": leading [B, H, ...]; "row": leading [B, ...]; "whole": replicated.
# The vmapped engine's operands, in call order (NeuralMemory.scan), and its results.
ENGINE_OPERANDS: tuple[tuple[str, str], ...] = (
    ("params", "row_head"), ("momentum", "row_head"), ("k", "row_head"), ("v", "row_head"),
    ("q", "row_head"), ("theta", "row_head"), ("eta", "row_head"), ("alpha", "row_head"),
    ("reset", "row"), ("reset_to", "row_head"), ("log_keep", "row_head"),
    ("state_length", "whole"),
)
ENGINE_RESULTS: tuple[tuple[str, str], ...] = (("reads", "row_head"), ("state", "row_head"))


def runs_kernel(impl: str, platform: str | None = None) -> bool:
    """Whether engine ``impl`` runs a Pallas kernel on ``platform`` (default: JAX's default
    backend): "pallas" always, "auto" on GPU and TPU (``pallas.scan.auto_choice``)."""
    if impl == "pallas":
        return True
    if impl == "auto":
        # deliberate: loads jax.experimental.pallas only when a kernel engine may run
        from titans_lm.memory.pallas.scan import auto_choice
        return auto_choice(platform or jax.default_backend()) == "pallas"
    return False


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    """How the engine's [B, H, ...] operands are split over a mesh.

    Attributes:
      mesh: the (abstract) mesh the engine is shard-mapped over (all its axes manual).
      batch_axes: mesh axes the batch dimension B is split over (product divides B).
      head_axes: mesh axes the head dimension H is split over (product divides H).
      reasons: why an axis was left out of a split (empty when every axis is used).
    """

    mesh: AbstractMesh
    batch_axes: tuple[str, ...]
    head_axes: tuple[str, ...]
    reasons: tuple[str, ...] = ()

    def spec(self, kind: str) -> P:
        """The PartitionSpec of a layout kind ("row_head", "row" or "whole").

        Raises:
          ValueError: for an unknown kind.
        """
        batch = self.batch_axes or None
        heads = self.head_axes or None
        table = {"row_head": P(batch, heads), "row": P(batch), "whole": P()}
        if kind not in table:
            raise ValueError(f"unknown layout kind {kind!r}; known: {sorted(table)}")
        return table[kind]


def layout_specs(plan: ShardPlan, layout: Sequence[tuple[str, str]]) -> tuple[P, ...]:
    """One PartitionSpec per (name, kind) entry of ``layout`` (a prefix of that operand's tree)."""
    return tuple(plan.spec(kind) for _, kind in layout)


def _split(dim: int, axes: Sequence[str], mesh: AbstractMesh, what: str, fields: str
           ) -> tuple[tuple[str, ...], list[str]]:
    """The axes (in order) of ``axes`` present in ``mesh`` with size > 1 whose running product
    divides ``dim``, and a reason for each one left out."""
    kept, reasons, n = [], [], 1
    for a in axes:
        size = dict(mesh.shape).get(a, 1)
        if size == 1:
            continue
        if dim % (n * size):
            reasons.append(f"{what} {dim} is not a multiple of mesh axis {a!r} ({size}) times the "
                           f"axes already used ({n}): not split over {a!r} ({fields})")
            continue
        kept.append(a)
        n *= size
    return tuple(kept), reasons


def shard_plan(mesh: AbstractMesh | None, batch: int, heads: int) -> ShardPlan | None:
    """The split of the engine's [B, H, ...] operands over ``mesh``.

    Args:
      mesh: an (abstract) mesh, or None for JAX's current one (``jax.sharding.get_abstract_mesh``).
      batch: B, the engine's batch rows (per micro-batch under gradient accumulation).
      heads: H, the memory heads (``MemoryConfig.n_heads``).
    Returns:
      None when there is no mesh, or it has one device (call the engine directly); else the
      plan (possibly with some axes left out, see ``reasons``).
    """
    mesh = jax.sharding.get_abstract_mesh() if mesh is None else mesh
    if mesh is None or mesh.empty or math.prod(mesh.shape.values()) == 1:
        return None
    batch_axes, r_batch = _split(batch, BATCH_AXES, mesh, "the engine's batch",
                                 "train.batch_size / train.grad_accum, mesh.data, mesh.fsdp")
    head_axes, r_heads = _split(heads, HEAD_AXES, mesh, "model.memory.n_heads",
                                "model.memory.n_heads, mesh.tensor")
    return ShardPlan(mesh, batch_axes, head_axes, tuple(r_batch + r_heads))


def run_engine(fn: Callable, operands: Sequence, *, impl: str, batch: int, heads: int,
               mesh: AbstractMesh | None = None):
    """``fn(*operands)``, per shard of the current mesh when ``impl`` runs a Pallas kernel.

    Args:
      fn: the engine vmapped over batch rows and heads (``NeuralMemory.scan``): called with the
        operands of :data:`ENGINE_OPERANDS` (tuples of [B, H, ...] for params, momentum and
        reset_to; [B, H, T, Dh] k, v, q; [B, H, T] theta, eta, alpha and log_keep (or None);
        bool [B, T] reset; state_length an int32 scalar or None), returning
        ``(reads [B, H, T, Dh], (params tuple, momentum tuple))`` with leading [B, H].
      operands: those operands, in that order; their dtypes pass through unchanged.
      impl: the engine implementation (``MemoryConfig.impl``); only kernel engines
        (:func:`runs_kernel`) are shard-mapped.
      batch, heads: B and H.
      mesh: the mesh, or None for JAX's current abstract mesh.
    Returns:
      what ``fn`` returns; under a mesh, global arrays split as the plan says.
    Raises:
      ValueError: when ``operands`` does not match :data:`ENGINE_OPERANDS`.
    """
    if len(operands) != len(ENGINE_OPERANDS):
        raise ValueError(f"run_engine takes {len(ENGINE_OPERANDS)} operands "
                         f"({[n for n, _ in ENGINE_OPERANDS]}), got {len(operands)}")
    plan = shard_plan(mesh, batch, heads) if runs_kernel(impl) else None
    if plan is None:
        return fn(*operands)
    for reason in plan.reasons:
        warn_once(_log, "memory engine under shard_map: %s; that dimension runs whole on each "
                  "device along the axis (correct, duplicated work)", reason)
    operands = list(operands)
    i = [n for n, _ in ENGINE_OPERANDS].index("state_length")
    if operands[i] is not None:   # an operand of shard_map must be an array
        operands[i] = jnp.asarray(operands[i], jnp.int32)
    # check_vma=False: pallas_call's outputs carry no varying-axes type (Pallas asks for
    # manual_axis_type on every out_shape under check_vma=True). The specs are exact for every
    # output, and an operand left whole along an axis (the fallback) gets its cotangent summed
    # over that axis by shard_map's transpose as usual; the tests check those gradients.
    mapped = jax.shard_map(fn, mesh=plan.mesh, in_specs=layout_specs(plan, ENGINE_OPERANDS),
                           out_specs=layout_specs(plan, ENGINE_RESULTS), check_vma=False)
    return mapped(*operands)
