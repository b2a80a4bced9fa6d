"""Document boundaries of packed windows as the memory layer needs them.

A window carries ``segment_ids`` (int32 [B, T]): 0 = padding, documents >= 1; a new document
starts wherever the id changes to a non-zero id (between two non-zero ids or from 0 to non-zero).
A padding run is not a document start: it continues (and, with theta = 0, leaves frozen) the
memory of the document before it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def document_starts(segment_ids_BT: jax.Array) -> jax.Array:
    """bool [B, T]: True where a document begins (position 0 counts when its id is non-zero)."""
    seg = segment_ids_BT
    prev = jnp.pad(seg[:, :-1], ((0, 0), (1, 0)), constant_values=0)
    return (seg != prev) & (seg != 0)


def document_index(segment_ids_BT: jax.Array) -> jax.Array:
    """int32 [B, T]: running count of document starts (equal values = same document run)."""
    return jnp.cumsum(document_starts(segment_ids_BT).astype(jnp.int32), axis=1)
