"""``project(x, w, n_in)``: a linear projection (x's last ``n_in`` axes contracted with w's first
``n_in``) whose weight gradient is computed as ``x^T g`` with the activations on the left.

Every projection of activations by a weight goes through it: attention's q/k/v/o
(:mod:`titans_lm.nn.attention`, :mod:`titans_lm.nn.context_attention`), SwiGLU
(:mod:`titans_lm.nn.mlp`), the gated output (:mod:`titans_lm.nn.gated_combine`) and the
NeuralMemory layer's projections (:mod:`titans_lm.memory.layer`). The output head keeps JAX's
einsum: it produces float32 logits from bfloat16 inputs (``preferred_element_type``), and the
tied head's weight gradient already has the embedding table's [vocab, d_model] layout.

The plain einsum is exact and JAX differentiates it, but JAX's transpose rule writes the weight
cotangent as ``g^T x``, and XLA's CPU backend then lays the cotangent ``g`` out transposed,
[out, tokens]: the fusion that produces ``g`` (for the memory's q/k/v projections: the SiLU,
short-convolution and L2-norm backward) is evaluated in that transposed order, reading its
inputs with a stride. In the NeuralMemory layer's forward + backward at T = 4096 (d_model 256,
chunk 64, one CPU core) those fusions took about 200 of 1,400 ms (four of them, 26-61 ms each,
for 1M elements). Here the backward computes ``dw = x^T g`` and ``dx = g w^T`` as plain matrix
products of the flattened arrays, so ``g`` keeps its natural [tokens, out] layout and only the
cheap activations ``x`` are transposed.

The custom gradient is a CPU layout fix, so it is used only where it helps: when JAX's default
backend is the CPU (decided at trace time) and outside ``forward_mode()``
(:mod:`titans_lm.nn.cpu_gradients`, re-exported here). Elsewhere (GPU, TPU)
``project`` is the plain einsum, which JAX differentiates in both modes. A ``jax.custom_vjp``
function has no forward mode: ``jax.jvp`` (and ``jax.linearize``, ``jax.jacfwd``, forward-over-
reverse Hessian products) through a model on the CPU must be traced inside ``with
forward_mode():``, which selects the plain einsum there too (the same values; only the CPU
backward's layout differs). ``jax.grad`` to any order works everywhere.
"""

from __future__ import annotations

import functools
import math

import jax

from titans_lm.nn.cpu_gradients import forward_mode, uses_custom_gradient

def project(x: jax.Array, w: jax.Array, n_in: int = 1) -> jax.Array:
    """``einsum`` of x's last ``n_in`` axes with w's first ``n_in`` axes.

    E.g. ``project(x_BTD, w_DHK)`` is ``einsum("btd,dhk->bthk")`` and ``project(r_BTHK, w_HKD, 2)``
    is ``einsum("bthk,hkd->btd")``.

    Args:
      x: [..., *I] activations, any float dtype.
      w: [*I, *O] weights, any float dtype.
      n_in: the number of contracted axes (>= 1).
    Returns:
      [..., *O] in the promoted dtype of x and w.
    Raises:
      ValueError: when x's last ``n_in`` axes are not w's first ``n_in`` axes.
    """
    if uses_custom_gradient():
        return _project_cpu(x, w, n_in)
    return _matmul(x, w, n_in)


__all__ = ["forward_mode", "project", "uses_custom_gradient"]


def _matmul(x, w, n_in):
    x2, w2, out_shape = _flat(x, w, n_in)
    return (x2 @ w2).reshape(out_shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _project_cpu(x: jax.Array, w: jax.Array, n_in: int = 1) -> jax.Array:
    """:func:`project` with the CPU-layout backward (module docstring)."""
    return _matmul(x, w, n_in)


def _flat(x, w, n_in):
    if n_in < 1 or n_in > min(x.ndim, w.ndim) or x.shape[x.ndim - n_in:] != w.shape[:n_in]:
        raise ValueError(f"project: the last {n_in} axes of x {x.shape} must be the first "
                         f"{n_in} axes of w {w.shape}")
    d_in = math.prod(w.shape[:n_in])
    x2 = x.reshape(-1, d_in)
    w2 = w.reshape(d_in, -1)
    return x2, w2, x.shape[:x.ndim - n_in] + w.shape[n_in:]


def _fwd(x, w, n_in):
    return _matmul(x, w, n_in), (x, w)


def _bwd(n_in, res, g):
    x, w = res
    x2, w2, _ = _flat(x, w, n_in)
    g2 = g.reshape(x2.shape[0], w2.shape[1])
    dx = (g2 @ w2.T.astype(g2.dtype)).reshape(x.shape)
    dw = (x2.T.astype(g2.dtype) @ g2).reshape(w.shape)   # activations on the left (see above)
    return dx.astype(x.dtype), dw.astype(w.dtype)


_project_cpu.defvjp(_fwd, _bwd)
