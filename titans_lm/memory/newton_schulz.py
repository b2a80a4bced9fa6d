"""Newton-Schulz steps on the memory's momentum (Atlas' Muon rule), and its materialised chunk step.

Atlas (Behrouz et al. 2025, arXiv:2505.23735) writes the memory with Muon's update: the momentum
accumulates raw gradients and the write is its approximate orthogonalisation NS_k (k Newton-Schulz
iterations). In the engine's notation (docs/design.md#newton-schulz-momentum), with ``ns_steps``
k > 0, for every weight MATRIX of the inner model:

    S_t = eta_t S_{t-1} - G_t,        P_t = keep_t P_{t-1} + theta_t NS_k(S_t)
                                            (+ (1 - keep_t) P_init with decay_target "initial")

eta stays the momentum gate; theta, which NS_k's scale invariance would cancel inside S, becomes
the step outside the map. NS_k is odd, so the sign of the descent direction is kept. Vector
parameters (biases, LayerNorm scale and shift) have no orthogonalisation: they take the plain
write theta_t S_t of the same momentum. ``ns_steps = 0`` is the engine without this rule.

NS_k is Muon's quintic map (Jordan et al. 2024): X <- S / (||S||_F + eps), transposed when it has
more rows than columns, then k times X <- a X + (b A + c A^2) X with A = X X^T and
(a, b, c) = (3.4445, -4.7750, 2.0315). After 5 steps the singular values of X lie roughly in
0.7..1.2 (the coefficients trade exactness for speed), not at exactly 1.

NS_k is nonlinear in S_t, so the chunked dual form's "no per-token weight matrix" does not apply:
within a chunk every token's momentum is materialised from the gradient factors at the chunk-start
state (:func:`chunk_states`), S_t = E0_t S0 - sum_{s<=t} M[t, s] u_s^T d_s, NS_k runs on the b
matrices as batched matmuls, and P_t = B_t P0 + R_t R0 + sum_{s<=t} C[t, s] NS_k(S_s) with
C[t, s] = theta_s prod_{s<j<=t} keep_j. Each token then reads through its own P_t
(:func:`read_states`). Cost: O(b d_in d_out) memory per chunk and weight matrix (b = chunk size),
and O(b^2 d_in d_out + k b d_in d_out min(d_in, d_out)) work.

Backward: exact automatic differentiation through NS_k ("exact"), or Atlas' straight-through
estimator ("straight_through": forward NS_k, backward the identity, as rkstgr/atlas-jax does).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from titans_lm.memory.coefficients import chunk_coefficients
from titans_lm.memory.inner_models import InnerModel

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_GRADIENTS = ("exact", "straight_through")
NS_EPS = 1e-7


def newton_schulz(x: jax.Array, steps: int, eps: float = NS_EPS) -> jax.Array:
    """Muon's quintic Newton-Schulz map NS_k: an approximate orthogonalisation of x.

    Args:
      x: [..., m, n] matrices (a batch over the leading axes), any float dtype.
      steps: k >= 0 iterations (0: x / (||x||_F + eps) only).
      eps: added to the Frobenius norm (a zero matrix maps to zero, with finite derivatives).
    Returns:
      [..., m, n], same dtype: roughly U V^T for x = U Sigma V^T (singular values ~0.7..1.2
      after 5 steps).
    """
    a, b, c = NS_COEFFICIENTS
    sq = jnp.sum(x * x, axis=(-2, -1), keepdims=True)
    nonzero = sq > 0
    norm = jnp.where(nonzero, jnp.sqrt(jnp.where(nonzero, sq, 1)), 0)   # finite derivative at 0
    X = x / (norm + eps)
    wide = x.shape[-2] <= x.shape[-1]
    if not wide:
        X = jnp.swapaxes(X, -1, -2)
    for _ in range(steps):
        A = X @ jnp.swapaxes(X, -1, -2)
        X = a * X + (b * A + c * (A @ A)) @ X
    return X if wide else jnp.swapaxes(X, -1, -2)


def orthogonalise(x: jax.Array, steps: int, gradient: str = "exact") -> jax.Array:
    """NS_k(x) (:func:`newton_schulz`) with the chosen backward pass.

    Args:
      x: [..., m, n]; steps: k >= 1.
      gradient: "exact" (differentiate through the iterations) or "straight_through" (forward
        NS_k(x), backward the identity: the cotangent of NS_k(x) passes to x unchanged).
    Raises:
      ValueError: for another ``gradient``.
    """
    if gradient == "exact":
        return newton_schulz(x, steps)
    if gradient == "straight_through":
        return _straight_through(x, steps)
    raise ValueError(f"ns_gradient must be one of {NS_GRADIENTS}, got {gradient!r}")


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _straight_through(x, steps):
    """NS_k(x) forward (bit for bit :func:`newton_schulz`), the identity backward."""
    return newton_schulz(x, steps)


def _straight_through_fwd(x, steps):
    return newton_schulz(x, steps), None


def _straight_through_bwd(steps, _, cotangent):
    return (cotangent,)


_straight_through.defvjp(_straight_through_fwd, _straight_through_bwd)


def write_direction(s: jax.Array, steps: int, gradient: str = "exact") -> jax.Array:
    """The write of one token's momentum s of one parameter, before theta: NS_k(s) for a matrix
    (s [m, n]), s itself for a vector (s [d]). The token loop's write."""
    return orthogonalise(s, steps, gradient) if s.ndim == 2 else s


class NSChunkCoefficients(NamedTuple):
    """Gate coefficients of one chunk under the Newton-Schulz rule ([b] or [b, b], gates' dtype).

    E0: [b] weight of the chunk-start momentum in S_t.
    M: [b, b] weight of G_s in S_t, prod_{s<j<=t} eta_j (no theta; zero above the diagonal).
    B: [b] decay of the chunk-start parameters in P_t.
    C: [b, b] weight of token s's write in P_t, theta_s prod_{s<j<=t} keep_j.
    R: [b] weight of the reset target in P_t, or None (no start inside the chunk, decay to zero).
    """

    E0: jax.Array
    M: jax.Array
    B: jax.Array
    C: jax.Array
    R: jax.Array | None = None


def ns_chunk_coefficients(theta, eta, alpha, *, log_keep=None, reset=None,
                          decay_to_target: bool = False) -> NSChunkCoefficients:
    """The coefficients of :class:`NSChunkCoefficients` from one chunk's [b] gates.

    Two uses of :func:`~titans_lm.memory.coefficients.chunk_coefficients`: the momentum's
    (theta = 1: M = E) and the parameters' (eta = 0: the write of token s is not carried on,
    so C = D theta), both with the same document starts (``reset``: a start at j zeroes the
    gates that carry earlier state through j) and decay target. ``eta`` None: no momentum;
    ``alpha`` and ``log_keep`` None: no decay (as :func:`chunk_coefficients`).
    """
    mom = chunk_coefficients(jnp.ones_like(theta), eta, alpha, log_keep=log_keep, reset=reset)
    par = chunk_coefficients(theta, None, alpha, log_keep=log_keep, reset=reset,
                             decay_to_target=decay_to_target)
    return NSChunkCoefficients(E0=mom.E0, M=mom.M, B=par.B, C=par.C, R=par.R)


def chunk_states(P0, S0, factors, coef: NSChunkCoefficients, *, steps: int, gradient: str,
                 outer: frozenset = frozenset(), reset_to=None, scale=None):
    """Every token's state (P_t, S_t) in one chunk, materialised (module docstring).

    Args:
      P0, S0: parameter and momentum tuples at the chunk start.
      factors: the chunk's gradient factors at P0 (``titans_lm.memory.chunked.GradientFactors``:
        per matrix inputs u [b, d_in] and signals d [b, d_out], G_s = u_s^T d_s; per vector the
        gradients [b, d]).
      coef: the chunk's :class:`NSChunkCoefficients`.
      steps, gradient: NS_k's k >= 1 and backward ("exact" | "straight_through").
      outer: indices of outer-loop parameters (pass through unchanged).
      reset_to: the reset target R0 (needed when coef.R is not None).
      scale: optional [b] per-token gradient scale (the surprise clip), applied to G_s.
    Returns:
      (P_all, S_all): tuples with a leading [b] axis (outer parameters broadcast).
    """
    b = coef.M.shape[0]
    M = coef.M if scale is None else coef.M * scale[None, :]
    P_all, S_all = [], []
    for i, (p0, s0, u, d) in enumerate(zip(P0, S0, factors.inputs, factors.signals)):
        if i in outer:
            P_all.append(jnp.broadcast_to(p0, (b,) + p0.shape))
            S_all.append(jnp.broadcast_to(s0, (b,) + s0.shape))
            continue
        if p0.ndim == 2:
            S = (coef.E0[:, None, None] * s0
                 - jnp.einsum("ts,si,sj->tij", M, u, d, precision=jax.lax.Precision.HIGHEST))
            W = orthogonalise(S, steps, gradient)
            P = (coef.B[:, None, None] * p0
                 + jnp.einsum("ts,sij->tij", coef.C, W, precision=jax.lax.Precision.HIGHEST))
        else:
            S = coef.E0[:, None] * s0 - M @ d
            P = coef.B[:, None] * p0 + coef.C @ S
        if coef.R is not None:
            P = P + coef.R.reshape((b,) + (1,) * p0.ndim) * reset_to[i]
        P_all.append(P)
        S_all.append(S)
    return tuple(P_all), tuple(S_all)


def read_states(model: InnerModel, P_all, q: jax.Array) -> jax.Array:
    """Each token's read through its own state: y_t = f(q_t; P_t).

    Args:
      model: the inner model; P_all: parameter tuple with a leading [b] axis; q: [b, d_k].
    Returns:
      [b, d_v].
    """
    return jax.vmap(model.apply)(P_all, q)


def state_after(P_all, S_all, start, n):
    """The state after the first ``n`` tokens of the chunk: row n - 1 of (P_all, S_all), or
    ``start`` (the chunk-start (P0, S0)) for n = 0. ``n``: int scalar in 0..b, may be traced."""
    b = P_all[0].shape[0]
    row = jnp.clip(n - 1, 0, b - 1)
    pick = lambda xs, xs0: tuple(jnp.where(n > 0, x[row], x0) for x, x0 in zip(xs, xs0))  # noqa: E731
    return pick(P_all, start[0]), pick(S_all, start[1])
