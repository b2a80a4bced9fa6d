"""Document structure of a packed window, derived from its segment ids.

A batch row holds several documents back to back. ``segment_ids_BT`` (int32 [B, T]) names the
document of every token: 0 marks padding, documents have ids >= 1, and a new document starts
wherever the id changes. :data:`PERSISTENT_SEGMENT_ID` (-1) marks persistent-memory tokens that a
backbone prepends to the sequence (Titans, Behrouz et al. 2025, section 3.3): every token may see
them, and they see only each other.

Everything here is a pure function of the ids, so models derive RoPE positions, document resets
and attention masks from one source and never look across a document boundary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

PERSISTENT_SEGMENT_ID = -1


def is_concrete(x) -> bool:
    """True outside jit (a value that checks may inspect); False for a traced value."""
    return not isinstance(x, jax.core.Tracer)


def _check_ids(segment_ids_BT, name: str = "segment_ids_BT") -> jnp.ndarray:
    s = jnp.asarray(segment_ids_BT)
    if s.ndim != 2:
        raise ValueError(f"{name} must have shape [B, T], got shape {s.shape}")
    if not jnp.issubdtype(s.dtype, jnp.integer):
        raise ValueError(f"{name} must be an integer array, got dtype {s.dtype}")
    return s


def doc_starts(segment_ids_BT) -> jnp.ndarray:
    """Where a new run of equal segment ids begins.

    Args:
      segment_ids_BT: int[B, T] segment ids (see module docstring).

    Returns:
      bool[B, T]: True at position 0 and wherever the id differs from the previous position
      (a change to or from padding counts too, so padding runs are runs of their own).

    Raises:
      ValueError: if the ids are not a 2-D integer array.
    """
    s = _check_ids(segment_ids_BT)
    first_B1 = jnp.ones((s.shape[0], min(s.shape[1], 1)), dtype=bool)
    return jnp.concatenate([first_B1, s[:, 1:] != s[:, :-1]], axis=1)


def document_ids(segment_ids_BT) -> jnp.ndarray:
    """Canonical ids: the 1-based index of each run of equal ids within its row.

    Two documents that happen to reuse one id in a row (``1 1 2 2 1 1``) get different canonical ids
    (``1 1 2 2 3 3``), so masks built from these ids never join separate runs. Persistent-memory
    positions keep :data:`PERSISTENT_SEGMENT_ID`.

    Returns:
      int32[B, T].
    """
    s = _check_ids(segment_ids_BT)
    runs = jnp.cumsum(doc_starts(s).astype(jnp.int32), axis=1)
    return jnp.where(s == PERSISTENT_SEGMENT_ID, PERSISTENT_SEGMENT_ID, runs).astype(jnp.int32)


def segment_positions(segment_ids_BT) -> jnp.ndarray:
    """Position of each token inside its document: 0 at every document start, counting up.

    Persistent-memory tokens all get position 0 (for RoPE this is the identity rotation, i.e. the
    same as carrying no position). Padding runs count from 0 like documents.

    Returns:
      int32[B, T].
    """
    s = _check_ids(segment_ids_BT)
    T = s.shape[1]
    idx_1T = jnp.arange(T, dtype=jnp.int32)[None, :]
    last_start_BT = lax.cummax(jnp.where(doc_starts(s), idx_1T, 0), axis=1)
    pos_BT = idx_1T - last_start_BT
    return jnp.where(s == PERSISTENT_SEGMENT_ID, 0, pos_BT).astype(jnp.int32)


def attention_mask(segment_ids_q, segment_ids_k, causal: bool = True, window: int | None = None):
    """Boolean attention mask from segment ids: which keys each query may attend to.

    Query i and key j are indexed in the same frame (position i of the queries is position i of the
    keys; for self-attention pass the same ids twice). For a query of an ordinary token, key j is
    visible iff it has the same segment id, j <= i when ``causal``, and it lies within the last
    ``window`` tokens including the query itself (i - j < window; |i - j| < window when not causal).
    Keys with :data:`PERSISTENT_SEGMENT_ID` are visible to every query; a persistent query sees all
    persistent keys and nothing else (a fully visible prefix, Titans section 3.3).

    Ids are compared by equality: pass :func:`document_ids` when a row may reuse an id for two
    separate documents.

    Args:
      segment_ids_q: int[B, Tq]; segment_ids_k: int[B, Tk].
      causal: mask future keys.
      window: sliding-window size in tokens (>= 1), or None for no window.

    Returns:
      bool[B, 1, Tq, Tk] (the head axis broadcasts in ``jax.nn.dot_product_attention``).

    Raises:
      ValueError: on non-2-D or non-integer ids, mismatched batch sizes, or a window < 1.
    """
    q = _check_ids(segment_ids_q, "segment_ids_q")
    k = _check_ids(segment_ids_k, "segment_ids_k")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"segment_ids_q and segment_ids_k batch sizes differ: {q.shape} vs {k.shape}")
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1 token (or None), got {window}")
    q_BQ1, k_B1K = q[:, :, None], k[:, None, :]
    i_Q1 = jnp.arange(q.shape[1])[:, None]
    j_1K = jnp.arange(k.shape[1])[None, :]
    ok_BQK = q_BQ1 == k_B1K
    if causal:
        ok_BQK = ok_BQK & (j_1K <= i_Q1)[None]
    if window is not None:
        dist_QK = (i_Q1 - j_1K) if causal else jnp.abs(i_Q1 - j_1K)
        ok_BQK = ok_BQK & (dist_QK < window)[None]
    persistent_q, persistent_k = q_BQ1 == PERSISTENT_SEGMENT_ID, k_B1K == PERSISTENT_SEGMENT_ID
    mask_BQK = jnp.where(persistent_q, persistent_k, ok_BQK | persistent_k)
    return mask_BQK[:, None, :, :]
