"""Atlas' Omega rule in the chunked dual form: each write sums the gradients of a sliding window.

Atlas (Behrouz et al. 2025, arXiv:2505.23735, sec. 3, the Omega rule) writes the memory with the
gradient of a weighted loss over the last c tokens instead of the last token alone. In the
engine's notation (docs/design.md#the-omega-rule), token t's gradient g_t becomes

    u_t = sum_{j = t-c+1..t, j in t's document} gamma_j g_j(P_base)

with P_base the state every gradient of t's mini-batch is taken at (the chunk-start state, or
the reset target after a document start inside the chunk) and gamma_j in [0, 1] a gate per token
and head. Atlas writes gamma_i^(t), which may depend on t; here gamma depends on the token j
only, so the window is a banded matrix. c = ``omega_window`` = 1 is the engine's rule.

``omega_normalize`` (not in Atlas) divides each u_t by sum_j gamma_j over the same window: the
write becomes the gates-weighted mean of the window's gradients, so a write's size (with the
surprise guard: at most 1 per gradient) no longer grows with c, and a step bound chosen for
c = 1 holds at any window. Exactly a row normalisation of Wmask below.

Dual form. Within a chunk of b tokens the state after token t is a linear combination of the
gradients, P_t = ... - sum_s C[t, s] u_s. With u = Wmask g over the extended token set
[c - 1 tokens before the chunk || the b chunk tokens] (their gradients all at P_base):

    C_ext = C @ Wmask,   Wmask[s, j] = gamma_j 1[s - c < j <= s] 1[j, s in the same document]

(the same for M, the weights in the momentum, and for the chunk-end rows). Everything else of
the dual form (factors at P_base, reads through depth-L MLPs, chunk-end state) is unchanged: the
gradient factors gain c - 1 rows per chunk. Pure functions, no state; positions are "extended":
index j of a chunk's extended set is the token j - (c - 1) of the chunk (negative: before it).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

HIGHEST = jax.lax.Precision.HIGHEST


def document_ids(reset: jax.Array, tail_valid: jax.Array) -> jax.Array:
    """int32 [c - 1 + T] document ids of [tail || sequence]: two positions share an id exactly
    when they are in the same document.

    Args:
      reset: bool [T] document starts of the sequence.
      tail_valid: bool [c - 1] whether each tail token (the c - 1 tokens before the sequence)
        is in the document that continues at the sequence's first token (absent a start there).
    Returns:
      ids: the sequence's are cumsum(reset) (0 up to its first start), a valid tail token's 0,
      an invalid one's -1 (it never meets a sequence token).
    """
    seq = jnp.cumsum(reset.astype(jnp.int32))
    tail = jnp.where(tail_valid, 0, -1).astype(jnp.int32)
    return jnp.concatenate([tail, seq])


def extended_windows(x_full: jax.Array, n_chunks: int, chunk_size: int, window: int) -> jax.Array:
    """[n_chunks, b + c - 1, ...]: chunk n's extended token set, rows n b .. n b + b + c - 2 of
    ``x_full`` ([c - 1 + n_chunks b, ...]: the tail, then the chunked sequence)."""
    width = chunk_size + window - 1
    idx = jnp.arange(n_chunks)[:, None] * chunk_size + jnp.arange(width)[None, :]
    return x_full[idx]


def omega_mask(gamma_ext: jax.Array, doc_ext: jax.Array, window: int,
               normalize: bool = False) -> jax.Array:
    """[b, b + c - 1] Wmask of one chunk: u_s = sum_j Wmask[s, j] g_j over the extended set.

    Wmask[s, j] = gamma_j for the extended positions j of token s's window (s <= j <= s + c - 1
    in extended coordinates: the tokens s - c + 1 .. s of the chunk) that are in s's document
    (``doc_ext[j] == doc_ext[s + c - 1]``), else exactly 0. With ``normalize`` every row is
    divided by its sum (the window's gamma-weighted mean; a row whose gates are all 0 stays 0).

    Args:
      gamma_ext: [b + c - 1] gates gamma_j of the extended set.
      doc_ext: int [b + c - 1] document ids of the extended set (:func:`document_ids`).
      window: c >= 1.
      normalize: ``MemoryConfig.omega_normalize``.
    """
    width = gamma_ext.shape[0]
    b = width - window + 1
    s = jnp.arange(b)[:, None]
    j = jnp.arange(width)[None, :]
    band = (j >= s) & (j <= s + window - 1)
    same = doc_ext[None, :] == doc_ext[window - 1:][:, None]
    mask = jnp.where(band & same, gamma_ext[None, :], jnp.zeros((), gamma_ext.dtype))
    return _normalized_rows(mask) if normalize else mask


def _normalized_rows(w: jax.Array) -> jax.Array:
    """w / sum(w) over the last axis (the window's gates -> weights of a mean); a row of zeros
    stays zeros (its sum is replaced by 1, so the gradient is finite there too)."""
    total = jnp.sum(w, axis=-1, keepdims=True)
    return w / jnp.where(total > 0, total, jnp.ones((), w.dtype))


def extend_rows(C: jax.Array, mask: jax.Array) -> jax.Array:
    """C @ Wmask: coefficient rows over the chunk's tokens to rows over its extended set.

    Args:
      C: [..., b, b] (a chunk's rows) or [..., b] (one row, the chunk end), leading axes those of
        ``mask``'s (a batch of chunks).
      mask: [..., b, b + c - 1] (:func:`omega_mask`).
    Returns:
      [..., b, b + c - 1] or [..., b + c - 1].
    """
    spec = "...is,...sj->...ij" if C.ndim == mask.ndim else "...s,...sj->...j"
    return jnp.einsum(spec, C, mask, precision=HIGHEST)


def tail_or_empty(omega_tail, window: int, d_k: int, d_v: int, dtype):
    """The window tail (k [c - 1, d_k], v [c - 1, d_v], gamma [c - 1], valid bool [c - 1]):
    ``omega_tail`` cast to ``dtype``, or that of a fresh stream (zeros, invalid) for None."""
    n = window - 1
    if omega_tail is None:
        return (jnp.zeros((n, d_k), dtype), jnp.zeros((n, d_v), dtype), jnp.zeros((n,), dtype),
                jnp.zeros((n,), bool))
    k, v, g, valid = omega_tail
    return k.astype(dtype), v.astype(dtype), g.astype(dtype), jnp.asarray(valid).astype(bool)


__all__ = ["document_ids", "extend_rows", "extended_windows", "omega_mask", "tail_or_empty"]
