"""Data-dependent gates of the memory: inner learning rate theta, momentum eta, forget gate alpha.

Per token and head, from pre-activations a = x W + b (Titans arXiv:2501.00663 sec. 3.1; TTT
arXiv:2407.04620 sec. 2.7):

    titans:  theta = theta_max * sigmoid(a_theta),   eta = eta_max * sigmoid(a_eta),
             alpha = sigmoid(a_alpha)      (the paper: eta_max = 1)
    ttt:     theta = base_lr * sigmoid(a_theta) / head_dim
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


def first_of_chunk(pre_BT_: jax.Array, chunk_size: int) -> jax.Array:
    """Replace every position's value by that of the first position of its chunk (axis 1).

    Causal: position t uses position chunk_size * (t // chunk_size) <= t.

    Args:
      pre_BT_: [B, T, ...] values.
      chunk_size: chunk length.
    Returns:
      same shape and dtype.
    """
    T = pre_BT_.shape[1]
    starts = (jnp.arange(T) // chunk_size) * chunk_size
    return jnp.take(pre_BT_, starts, axis=1)
