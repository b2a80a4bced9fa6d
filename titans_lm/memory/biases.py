"""Attentional biases: the inner loss l(y, v) that the memory's write descends.

MIRAS (Behrouz et al. 2025, arXiv:2504.13173) calls the inner objective of an associative memory
its attentional bias. Per token, with y = f(k; P) the memory's output [N, d_v] and v the value
[N, d_v] (both summed over rows and features; no factor 1/2):

    "l2"   l(y, v) = ||y - v||^2          dl/dy = 2 (y - v)     (Titans eq. 12; TTT; the delta rule)
    "dot"  l(y, v) = -2 <y, v>            dl/dy = -2 v          (Hebbian: linear attention)

The dot bias is the l2 bias less its terms ||y||^2 and ||v||^2 (||y - v||^2 = ||y||^2 - 2 <y, v>
+ ||v||^2), so theta has the same scale under both: a linear memory with theta = 1/2 writes
P += k^T v under "dot" (Katharopoulos et al. 2020) and P += k^T (v - k P) under "l2" with unit
keys (the delta rule, beta = 2 theta).

Both the chunked engine (``titans_lm.memory.chunked.gradient_factors``, which back-propagates
dl/dy) and the token loop (``InnerModel.loss``) take the bias from here, so a new bias (l_p,
Huber) is one more entry in :data:`BIASES`. The Pallas kernels implement "l2" only.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class AttentionalBias:
    """One inner loss. ``loss(y, v)``: the scalar sum over rows; ``grad(y, v)``: dl/dy, [N, d_v]."""

    name: str
    loss: Callable[[jax.Array, jax.Array], jax.Array]
    grad: Callable[[jax.Array, jax.Array], jax.Array]


BIASES = {
    "l2": AttentionalBias("l2", lambda y, v: jnp.sum((y - v) ** 2), lambda y, v: 2 * (y - v)),
    "dot": AttentionalBias("dot", lambda y, v: -2 * jnp.sum(y * v), lambda y, v: -2 * v),
}
DEFAULT_BIAS = "l2"


def get_bias(name: str) -> AttentionalBias:
    """The attentional bias named ``name``.

    Raises:
      ValueError: for an unknown name (listing the known ones).
    """
    if name not in BIASES:
        raise ValueError(f"unknown attentional_bias {name!r}; known: {sorted(BIASES)}")
    return BIASES[name]
