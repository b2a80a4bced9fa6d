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

from titans_lm.nn.channel_scale import channel_scale
from titans_lm.nn.init import check_axes
from titans_lm.nn.segments import segment_positions


def causal_depthwise_conv(x_BTC: jax.Array, w_KC: jax.Array, segment_ids_BT: jax.Array) -> jax.Array:
    """Document-resetting causal depthwise convolution of one window (pure function).

    Args:
      x_BTC: [B, T, *C] input (any trailing channel shape, e.g. [H, head_dim]).
      w_KC: [K, *C] taps, one filter per channel; w_KC[i] multiplies the token i steps back.
      segment_ids_BT: int [B, T] segment ids (see ``titans_lm.nn.segments``).

    Returns:
      [B, T, *C] in the promoted dtype of x and w.

    Raises:
      ValueError: on mismatched shapes.
    """
    if segment_ids_BT.shape != x_BTC.shape[:2]:
        raise ValueError(f"segment_ids shape {segment_ids_BT.shape} does not match x {x_BTC.shape[:2]}")
    return carried_causal_conv(x_BTC, w_KC, segment_positions(segment_ids_BT))[0]


def carried_causal_conv(x_BTC: jax.Array, w_KC: jax.Array, positions_BT: jax.Array,
                        tail_BKC: jax.Array | None = None, tail_at=None
                        ) -> tuple[jax.Array, jax.Array]:
    """The convolution of a call that continues a stream, with the carried tail of inputs.

        y_t = sum_i w[i] * z_{t-i} * [positions_t >= i],   z = [tail || x]

    ``positions_BT`` is each token's position inside its run (``titans_lm.nn.stream.Stream
    .positions``, continuing across calls; ``segment_positions`` for one window), so a tap reaches
    back only inside the token's own run, into the tail when the run began in an earlier call.

    Args:
      x_BTC: [B, T, *C] inputs of this call.
      w_KC: [K, *C] taps.
      positions_BT: int [B, T] within-run positions.
      tail_BKC: [B, K - 1, *C] the inputs of the previous K - 1 tokens of the stream (oldest
        first), or None for a stream that starts here (zeros; masked anyway).
      tail_at: None, or an int in 0..T (may be traced): return the tail before token tail_at
        instead of the tail after the call (a caller that re-runs the call's end later).
    Returns:
      (y [B, T, *C] in the promoted dtype of x and w, new tail [B, K - 1, *C]: the K - 1 inputs
      of [tail || x] before token ``tail_at`` (default: the last K - 1), in x's dtype).
    Raises:
      ValueError: on mismatched shapes.
    """
    if x_BTC.ndim < 3 or w_KC.ndim != x_BTC.ndim - 1 or w_KC.shape[1:] != x_BTC.shape[2:]:
        raise ValueError(f"conv wants x [B, T, *C] and w [K, *C]; got {x_BTC.shape} and {w_KC.shape}")
    if positions_BT.shape != x_BTC.shape[:2]:
        raise ValueError(f"positions shape {positions_BT.shape} does not match x {x_BTC.shape[:2]}")
    (B, T), K, extra = x_BTC.shape[:2], w_KC.shape[0], x_BTC.ndim - 2
    n_tail = K - 1
    if tail_BKC is None:
        tail_BKC = jnp.zeros((B, n_tail) + x_BTC.shape[2:], x_BTC.dtype)
    if tail_BKC.shape != (B, n_tail) + x_BTC.shape[2:]:
        raise ValueError(f"conv tail must be [B, K - 1, *C] = {(B, n_tail) + x_BTC.shape[2:]}, got "
                         f"{tail_BKC.shape}")
    z = jnp.concatenate([tail_BKC.astype(x_BTC.dtype), x_BTC], axis=1)
    pos = positions_BT.reshape(positions_BT.shape + (1,) * extra)
    y = channel_scale(x_BTC, w_KC[0])       # x * w, with a fast tap gradient on CPU
    for i in range(1, K):
        y = y + channel_scale(jnp.where(pos >= i, z[:, n_tail - i: n_tail - i + T], 0), w_KC[i])
    if tail_at is None:
        return y, z[:, T:]
    return y, jax.lax.dynamic_slice_in_dim(z, tail_at, n_tail, axis=1)


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
