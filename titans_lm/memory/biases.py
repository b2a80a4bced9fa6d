"""Attentional biases: the inner loss l(y, v) that the memory's write descends.

MIRAS (Behrouz, Razaviyayn, Zhong, Mirrokni 2025, arXiv:2504.13173) calls the inner objective of
an associative memory its attentional bias. Per token, with y = f(k; P) the memory's output
[N, d_v], v the value [N, d_v] and r = y - v the residual (all summed over rows and features; no
factor 1/2, as in Titans eq. 12):

    "l2"     l = ||r||^2                        dl/dy = 2 r       (Titans eq. 12; TTT; the delta rule)
    "dot"    l = -2 <y, v>                      dl/dy = -2 v      (Hebbian: linear attention)
    "lp"     l = sum_i (r_i^2 + e^2)^(p/2) - e^p                  (MIRAS' l_p bias, Moneta: ||r||_p^p)
             dl/dy = p r (r^2 + e^2)^(p/2 - 1)     e = LP_EPS, and e = 0 for p = 2
    "huber"  l = sum_i h(r_i),  h(r) = r^2 for |r| <= delta, 2 delta |r| - delta^2 beyond
             dl/dy = 2 clip(r, -delta, delta)                     (Huber's loss times 2; Yaad)

The dot bias is the l2 bias less its terms ||y||^2 and ||v||^2 (||y - v||^2 = ||y||^2 - 2 <y, v>
+ ||v||^2), so theta has the same scale under both: a linear memory with theta = 1/2 writes
P += k^T v under "dot" (Katharopoulos et al. 2020) and P += k^T (v - k P) under "l2" with unit
keys (the delta rule, beta = 2 theta). The l_p bias is MIRAS' ||r||_p^p without 1/p, so p = 2 is
the l2 bias (dl/dy = 2 r exactly: (r^2)^0 = 1), and Huber's without its 1/2, so it is the l2 bias
on residuals within delta (and exactly l2 for a delta beyond every residual).

Smoothness. The engine differentiates dl/dy again for the outer gradient (the write depends on
y through dl/dy), so dl/dy must be differentiable with a finite derivative: for 1 < p < 2,
|r|^(p-1) sign(r) has an infinite slope at r = 0, and for 2 < p < 3 automatic differentiation
of r |r|^(p-2) meets 0 * inf there. So |r| is smoothed to sqrt(r^2 + e^2) with e =
:data:`LP_EPS` for every p != 2 (MIRAS replaces |.| and sign by smooth approximations for the
same reason): dl/dy is then smooth, its slope at r = 0 is p e^(p-2) (47 at p = 1.5), it differs
from p |r|^(p-1) sign(r) only for |r| within a few e, and l(0) = 0 still. p = 2 takes e = 0, so
it is the l2 bias exactly. Huber's dl/dy is continuous with slope 2 inside the threshold and 0
outside (finite everywhere).

Both the chunked engine (``titans_lm.memory.chunked.gradient_factors``, which back-propagates
dl/dy) and the token loop (``InnerModel.loss``, differentiated by JAX) take the bias from here.
The Pallas kernels implement "l2" only; the delta rule's WY form (``gradient_at="previous_token"``)
is l2 only.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

BIASES = ("l2", "dot", "lp", "huber")
DEFAULT_BIAS = "l2"
LP_EPS = 1e-3   # smoothing of |r| in the l_p bias for p < 2 (module docstring)


@dataclasses.dataclass(frozen=True)
class AttentionalBias:
    """One inner loss (hashable: a static argument of jit).

    Attributes:
      name: one of :data:`BIASES`.
      p: the exponent of "lp" (> 1; unused by the others).
      delta: the threshold of "huber" (> 0; unused by the others).

    ``loss(y, v)``: the scalar sum over rows and features; ``grad(y, v)``: dl/dy, the shape of
    y ([N, d_v] or [d_v]). Both work in the dtype of y.
    """

    name: str
    p: float = 2.0
    delta: float = 1.0

    def loss(self, y: jax.Array, v: jax.Array) -> jax.Array:
        if self.name == "dot":
            return -2 * jnp.sum(y * v)
        r = y - v
        if self.name == "l2":
            return jnp.sum(r ** 2)
        if self.name == "lp":
            e2, e = self._eps()
            return jnp.sum((r * r + e2) ** (self.p / 2) - e ** self.p)
        a = jnp.abs(r)
        return jnp.sum(jnp.where(a <= self.delta, r * r, 2 * self.delta * a - self.delta ** 2))

    def grad(self, y: jax.Array, v: jax.Array) -> jax.Array:
        if self.name == "dot":
            return -2 * v
        r = y - v
        if self.name == "l2":
            return 2 * r
        if self.name == "lp":
            e2, _ = self._eps()
            return self.p * r * (r * r + e2) ** (self.p / 2 - 1)
        return 2 * jnp.clip(r, -self.delta, self.delta)

    def _eps(self):
        e = 0.0 if self.p == 2 else LP_EPS
        return e * e, e


def bias_problem(name, p: float = 2.0, delta: float = 1.0) -> str | None:
    """Why (name, p, delta) is not an attentional bias, in one sentence; None when it is."""
    if name not in BIASES:
        return f"unknown attentional_bias {name!r}; known: {sorted(BIASES)}"
    if name == "lp" and not (isinstance(p, (int, float)) and p > 1):
        return (f"attentional_bias 'lp' needs an exponent p > 1 (bias_p), got {p!r} (p = 1 has "
                f"no derivative at a zero residual; use 'huber' for an l1-like bias)")
    if name == "huber" and not (isinstance(delta, (int, float)) and delta > 0):
        return f"attentional_bias 'huber' needs a threshold delta > 0 (huber_delta), got {delta!r}"
    return None


def get_bias(bias, p: float = 2.0, delta: float = 1.0) -> AttentionalBias:
    """The attentional bias ``bias``: a name of :data:`BIASES` (with ``p`` for "lp" and ``delta``
    for "huber"), or an :class:`AttentionalBias` (returned as it is, after the same checks).

    Raises:
      ValueError: for an unknown name, p <= 1 with "lp", or delta <= 0 with "huber".
    """
    if isinstance(bias, AttentionalBias):
        name, p, delta = bias.name, bias.p, bias.delta
    else:
        name = bias
    problem = bias_problem(name, p, delta)
    if problem:
        raise ValueError(problem)
    if isinstance(bias, AttentionalBias):
        return bias
    # p and delta only where they matter, so equal biases compare (and hash) equal
    return AttentionalBias(name, p=float(p) if name == "lp" else 2.0,
                           delta=float(delta) if name == "huber" else 1.0)
