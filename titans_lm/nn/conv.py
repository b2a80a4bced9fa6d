"""Causal depthwise short convolution that restarts at every document start.

    y_t[c] = sum_{i=0}^{K-1} w[i, c] * x_{t-i}[c] * [t - i >= start of t's document]

(w[0] weighs the current token.) Used on keys/queries/values by Titans (Behrouz et al. 2025,
section 4.4, after Mamba/GLA-style short convolutions) and TTT's Mamba backbone. Taps that would
reach before the document start are zeroed, so no information crosses a document boundary:
the outputs of a document depend on that document's tokens only.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from titans_lm.nn.init import check_axes
from titans_lm.nn.segments import segment_positions


def causal_depthwise_conv(x_BTC: jax.Array, w_KC: jax.Array, segment_ids_BT: jax.Array) -> jax.Array:
    """Document-resetting causal depthwise convolution (pure function).

    Args:
      x_BTC: [B, T, *C] input (any trailing channel shape, e.g. [H, head_dim]).
      w_KC: [K, *C] taps, one filter per channel; w_KC[i] multiplies the token i steps back.
      segment_ids_BT: int [B, T] segment ids (see ``titans_lm.nn.segments``).

    Returns:
      [B, T, *C] in the promoted dtype of x and w.

    Raises:
      ValueError: on mismatched shapes.
    """
    if x_BTC.ndim < 3 or w_KC.ndim != x_BTC.ndim - 1 or w_KC.shape[1:] != x_BTC.shape[2:]:
        raise ValueError(f"conv wants x [B, T, *C] and w [K, *C]; got {x_BTC.shape} and {w_KC.shape}")
    if segment_ids_BT.shape != x_BTC.shape[:2]:
        raise ValueError(f"segment_ids shape {segment_ids_BT.shape} does not match x {x_BTC.shape[:2]}")
    T, extra = x_BTC.shape[1], x_BTC.ndim - 2
    pos = segment_positions(segment_ids_BT).reshape(segment_ids_BT.shape + (1,) * extra)
    y = x_BTC * w_KC[0]
    for i in range(1, min(w_KC.shape[0], T)):
        shifted = jnp.pad(x_BTC[:, : T - i], ((0, 0), (i, 0)) + ((0, 0),) * extra)
        y = y + jnp.where(pos >= i, shifted, 0) * w_KC[i]
    return y


class ShortConv(nnx.Module):
    """Causal depthwise conv module: ``conv(x_BTC, segment_ids_BT) -> y_BTC``.

    Args:
      channels: C.
      kernel_size: K taps (default 4), including the current token.
      dtype: compute dtype; param_dtype: storage dtype.
      axes: logical axis names of the [K, C] weight (default (None, "embed")).
      rngs: nnx.Rngs.

    Init: uniform(-1/sqrt(K), 1/sqrt(K)), PyTorch's Conv1d default for a depthwise filter
    (fan_in = K), as in Mamba's and fla's short convolutions. No bias.
    """

    def __init__(self, channels: int, kernel_size: int = 4, *, dtype=jnp.float32,
                 param_dtype=jnp.float32, axes: tuple = (None, "embed"), rngs: nnx.Rngs):
        if channels < 1 or kernel_size < 1:
            raise ValueError(f"channels and kernel_size must be >= 1, got {channels}, {kernel_size}")
        check_axes((kernel_size, channels), axes)
        bound = 1.0 / math.sqrt(kernel_size)

        def uniform_init(key, shape, dtype=jnp.float32):
            return jax.random.uniform(key, shape, dtype, -bound, bound)

        init = nnx.with_partitioning(uniform_init, tuple(axes))
        self.w = nnx.Param(init(rngs.params(), (kernel_size, channels), param_dtype))
        self.kernel_size, self.dtype = kernel_size, dtype

    def __call__(self, x_BTC: jax.Array, segment_ids_BT: jax.Array) -> jax.Array:
        return causal_depthwise_conv(x_BTC.astype(self.dtype), self.w[...].astype(self.dtype),
                                     segment_ids_BT)
