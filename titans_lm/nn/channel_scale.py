"""``channel_scale(x, w) = x * w``, w broadcast over x's leading axes, with a weight gradient
computed as one contraction.

The plain product is exact and JAX differentiates it, but the weight's cotangent is then a
reduction over every leading axis (batch, tokens) that XLA's CPU backend fuses with the ops
that produce the cotangent and runs through a slow path: the short convolution's tap gradient
took 61 ms for [1, 4096, 4, 64] (fwd + bwd), against 1.5 ms with this function, and an RMSNorm
scale at D = 256, T = 4096 took 30.5 ms against 2.8 ms (2-core CPU, jax 0.10.2). Here the
backward computes ``dw = 1^T (g * x)`` over the flattened leading axes as a matrix product,
which XLA does not fuse with the product's producers.

The custom gradient is used where it helps only: on the CPU backend outside ``forward_mode()``
(:mod:`titans_lm.nn.cpu_gradients`); elsewhere ``channel_scale`` is the plain product, which JAX
differentiates in both modes (``jax.jvp`` included). ``jax.grad`` to any order works everywhere.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from titans_lm.nn.cpu_gradients import uses_custom_gradient


def channel_scale(x: jax.Array, w: jax.Array) -> jax.Array:
    """x * w.

    Args:
      x: [..., *C] any float dtype.
      w: [*C] (the trailing shape of x), any float dtype.
    Returns:
      x * w, [..., *C] in the promoted dtype.
    Raises:
      ValueError: when w's shape is not x's trailing shape.
    """
    _check(x, w)
    if uses_custom_gradient():
        return _channel_scale_cpu(x, w)
    return x * w


@jax.custom_vjp
def _channel_scale_cpu(x: jax.Array, w: jax.Array) -> jax.Array:
    """:func:`channel_scale` with the CPU backward (module docstring)."""
    return x * w


def _check(x, w):
    if w.ndim > x.ndim or x.shape[x.ndim - w.ndim:] != w.shape:
        raise ValueError(f"channel_scale: w {w.shape} must be the trailing shape of x {x.shape}")


def _fwd(x, w):
    _check(x, w)
    return x * w, (x, w)


def _bwd(res, g):
    x, w = res
    n = w.size
    acc = jnp.promote_types(g.dtype, x.dtype)
    gx = (g.astype(acc) * x.astype(acc)).reshape(-1, n)
    dw = jnp.ones((1, gx.shape[0]), acc) @ gx        # a matmul: XLA keeps it apart from gx
    return (g * w).astype(x.dtype), dw.reshape(w.shape).astype(w.dtype)


_channel_scale_cpu.defvjp(_fwd, _bwd)
