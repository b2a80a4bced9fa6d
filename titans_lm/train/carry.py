"""Stateful training (truncated backprop through time): the model state carried from step to step.

With ``train.carry_state=True`` (Transformer-XL, Dai et al. 2019, sec. 3.2; the recurrent-memory
literature), batch row ``r`` of step ``s + 1`` continues the documents row ``r`` of step ``s``
stopped in (``titans_lm.data.stream_pipeline.StreamIterator``), and the train step runs the model's
stateful call ``model(tokens_BT, segment_ids_BT, state) -> (logits, state)``
(``titans_lm.models.lm.LanguageModel``) from the state the previous step returned:

* the state is ``TrainState.model_state``: a pytree of arrays, sharded like the batch (every leaf
  whose leading axis is the batch row over the data axes, the per-stream scalars such as the
  stream position replicated: :func:`model_state_shardings`), saved in checkpoints and restored
  with them, so resuming mid-document is exact;
* the gradient stops at the window boundary: the incoming state is a constant of the step's loss
  (``lax.stop_gradient``); the loss is the usual next-token loss of this window's targets;
* what the state holds *about the parameters* rather than about the stream is rebuilt from the
  current parameters at every step (:func:`refresh`): a neural memory's reset target (W0, or the
  state the persistent tokens leave) and attention's persistent-token slots. A document that
  starts in a later step therefore starts from the current W0, which gets its gradient through it,
  never from the parameters of the step that built the state.

A document start inside a window resets every layer exactly as in stateless training; a window that
continues a document does not reset at its first token (``titans_lm.nn.stream``). With stateless
training the same model sees every window from the initial state; the first window of each row is
identical in both modes.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from titans_lm.memory.carried import MemoryState
from titans_lm.nn.attention import AttentionState
from titans_lm.train import sharding as shd


def _is_node(x: Any) -> bool:
    return isinstance(x, (MemoryState, AttentionState))


def refresh(carried: Any, fresh: Any) -> Any:
    """``carried`` with its parameter-derived parts taken from ``fresh``.

    Args:
      carried: a model state (``LanguageModel`` state pytree) from a previous call.
      fresh: ``model.init_state(B)`` of the same model with the current parameters.

    Returns:
      ``carried`` where every :class:`~titans_lm.memory.carried.MemoryState` has ``fresh``'s
      ``reset_to`` and every :class:`~titans_lm.nn.attention.AttentionState` has ``fresh``'s
      ``persistent`` slots; every other leaf is ``carried``'s.

    Raises:
      ValueError: the two states have different structures.
    """
    def pick(c, f):
        if isinstance(c, MemoryState):
            return c._replace(reset_to=f.reset_to)
        if isinstance(c, AttentionState):
            return c._replace(persistent=f.persistent)
        return c
    try:
        return jax.tree.map(pick, carried, fresh, is_leaf=_is_node)
    except ValueError as e:
        raise ValueError(f"the carried model state does not match the model's state: {e}") from e


def batch_leaves(abstract_state_fn, batch_size: int) -> Any:
    """A tree like the model state of ``batch_size`` rows, of bools: True for a leaf whose leading
    axis is the batch row. ``abstract_state_fn(b)`` gives the abstract state (``ShapeDtypeStruct``
    leaves) of ``b`` rows; the states of ``batch_size`` and ``batch_size + 1`` rows are compared."""
    a, b = abstract_state_fn(batch_size), abstract_state_fn(batch_size + 1)
    return jax.tree.map(lambda x, y: len(x.shape) > 0 and y.shape[0] == x.shape[0] + 1, a, b)


def model_state_shardings(abstract_state_fn, batch_size: int, mesh: Mesh) -> Any:
    """``NamedSharding`` per leaf of the carried state: batch-row leaves over the mesh's batch
    axes (like the batch), the rest (per-stream scalars) replicated. ``abstract_state_fn`` as in
    :func:`batch_leaves`."""
    rows = NamedSharding(mesh, P(shd.BATCH_AXES))
    rep = shd.replicated(mesh)
    return jax.tree.map(lambda is_row: rows if is_row else rep,
                        batch_leaves(abstract_state_fn, batch_size))


def cast_like(tree: Any, like: Any) -> Any:
    """``tree`` with every leaf cast to the dtype of ``like``'s leaf (the carried state keeps one
    structure and one set of dtypes from step to step)."""
    return jax.tree.map(lambda x, y: jnp.asarray(x).astype(y.dtype), tree, like)
