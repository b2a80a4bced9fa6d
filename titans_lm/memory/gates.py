"""Data-dependent gates of the memory: inner learning rate theta, momentum eta, forget gate alpha.

Per token and head, from pre-activations a = x W + b (Titans arXiv:2501.00663 sec. 3.1; TTT
arXiv:2407.04620 sec. 2.7):

    titans:  theta = theta_max * sigmoid(a_theta),   eta = eta_max * sigmoid(a_eta),
             alpha = sigmoid(a_alpha)      (the paper: eta_max = 1)
    ttt:     theta = base_lr * sigmoid(a_theta) / head_dim
    omega:   gamma = sigmoid(a_gamma)      (Atlas' Omega rule, arXiv:2505.23735 sec. 3: the weight
             of a token's loss in the sliding windows it is in; MemoryConfig.omega_window > 1)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def titans_theta(pre: jax.Array, theta_max: float) -> jax.Array:
    """theta = theta_max * sigmoid(pre), in (0, theta_max)."""
    return theta_max * jax.nn.sigmoid(pre)


def titans_eta(pre: jax.Array, eta_max: float = 1.0) -> jax.Array:
    """eta = eta_max * sigmoid(pre), in (0, eta_max) (``MemoryConfig.eta_max``)."""
    s = jax.nn.sigmoid(pre)
    return s if eta_max == 1 else eta_max * s


def ttt_theta(pre: jax.Array, base_lr: float, head_dim: int) -> jax.Array:
    """TTT's learnable inner learning rate: base_lr * sigmoid(pre) / head_dim."""
    return base_lr * jax.nn.sigmoid(pre) / head_dim


def omega_gamma(pre: jax.Array) -> jax.Array:
    """gamma = sigmoid(pre) in (0, 1): a token's weight in the Omega windows it is in."""
    return jax.nn.sigmoid(pre)


def first_of_chunk(pre_BT_: jax.Array, chunk_size: int, starts_BT: jax.Array | None = None) -> jax.Array:
    """Replace every position's value by that of the first position of its mini-batch (axis 1):
    its chunk's first position, or the latest document start inside the chunk at or before it
    (a document start cuts the chunk: docs/design.md#resets-inside-a-chunk).

    Causal: position t uses a position <= t, and never one of an earlier document.

    Args:
      pre_BT_: [B, T, ...] values.
      chunk_size: chunk length.
      starts_BT: optional bool [B, T] document starts.
    Returns:
      same shape and dtype.
    """
    B, T = pre_BT_.shape[:2]
    t = jnp.arange(T)
    src = jnp.broadcast_to((t // chunk_size) * chunk_size, (B, T))
    if starts_BT is not None:
        src = jnp.maximum(src, jax.lax.cummax(jnp.where(starts_BT, t, -1), axis=1))
    src = src.reshape((B, T) + (1,) * (pre_BT_.ndim - 2))
    return jnp.take_along_axis(pre_BT_, src, axis=1)
