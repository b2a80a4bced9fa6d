"""Rotary position embedding (Su et al. 2021, RoFormer, eq. 34), half-split ("rotate_half") layout.

Feature pairs (x_i, x_{i + K/2}) of a head of size K are rotated by the angle p * theta^(-2i/K) at
position p. Then <R_p q, R_s k> depends on q, k and p - s only (RoFormer eq. 16). The angles,
sin and cos are computed in float32 (float64 when the input is float64).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rope_inv_freq(head_dim: int, theta: float = 10000.0, dtype=jnp.float32) -> jax.Array:
    """Inverse frequencies theta^(-2i/K), i = 0..K/2-1, as ``dtype`` [K/2].

    Raises:
      ValueError: if head_dim is not a positive even number or theta <= 0.
    """
    if head_dim < 2 or head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim >= 2, got {head_dim}")
    if theta <= 0:
        raise ValueError(f"rope theta must be positive, got {theta}")
    return 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=dtype) / head_dim))


def apply_rope(x_BTHK: jax.Array, positions_BT: jax.Array, theta: float = 10000.0) -> jax.Array:
    """Rotate queries or keys by their per-token positions.

    Args:
      x_BTHK: [B, T, H, K] queries or keys, K even.
      positions_BT: int [B, T] token positions (e.g. ``segment_positions``; restart at 0 per document).
      theta: RoPE base.

    Returns:
      [B, T, H, K] in the dtype of ``x_BTHK`` (rotation computed in >= float32).

    Raises:
      ValueError: on mismatched shapes or an odd head size.
    """
    if x_BTHK.ndim != 4 or positions_BT.shape != x_BTHK.shape[:2]:
        raise ValueError(f"apply_rope wants x [B, T, H, K] and positions [B, T]; got {x_BTHK.shape} "
                         f"and {positions_BT.shape}")
    K = x_BTHK.shape[-1]
    ft = jnp.promote_types(x_BTHK.dtype, jnp.float32)
    inv_freq = rope_inv_freq(K, theta, ft)
    angles_BT1k = (positions_BT.astype(ft)[..., None] * inv_freq)[:, :, None, :]
    sin, cos = jnp.sin(angles_BT1k), jnp.cos(angles_BT1k)
    x = x_BTHK.astype(ft)
    x1, x2 = x[..., : K // 2], x[..., K // 2:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BTHK.dtype)
