"""Causal depthwise short convolution that never mixes two documents (Titans sec. 4.4).

    y[t] = sum_{j=0}^{K-1} w[K-1-j] * x[t-j] * [t - j >= 0 and doc[t - j] == doc[t]]

Row K-1 of the kernel multiplies the current token, row 0 the token K-1 positions back. The
document mask restarts the window at every document start, exactly as if each document were
convolved on its own with zero left-padding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def causal_depthwise_conv(x_BTC: jax.Array, w_KC: jax.Array, doc_BT: jax.Array) -> jax.Array:
    """Depthwise causal convolution with document resets.

    Args:
      x_BTC: [B, T, *C] inputs (any trailing channel shape, e.g. [H, head_dim]).
      w_KC: [K, *C] kernel, one filter per channel.
      doc_BT: int [B, T] document index (see titans_lm.memory.documents.document_index).
    Returns:
      [B, T, *C], dtype of x.
    Raises:
      ValueError: when the kernel's channel shape does not match x's.
    """
    if w_KC.shape[1:] != x_BTC.shape[2:]:
        raise ValueError(f"conv kernel channels {tuple(w_KC.shape[1:])} do not match input channels "
                         f"{tuple(x_BTC.shape[2:])}")
    K = w_KC.shape[0]
    T = x_BTC.shape[1]
    extra = x_BTC.ndim - 2
    y = jnp.zeros_like(x_BTC)
    for j in range(min(K, T)):
        x_shift = jnp.pad(x_BTC[:, :T - j], ((0, 0), (j, 0)) + ((0, 0),) * extra)
        doc_shift = jnp.pad(doc_BT[:, :T - j], ((0, 0), (j, 0)), constant_values=-1)
        same = (doc_shift == doc_BT).reshape(doc_BT.shape + (1,) * extra)
        y = y + jnp.where(same, x_shift, 0) * w_KC[K - 1 - j].astype(x_BTC.dtype)
    return y
