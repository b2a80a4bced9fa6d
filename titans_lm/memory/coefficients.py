"""Scalar coefficients of one chunk of the memory recurrence in closed (dual) form.

Inside a chunk of b tokens (positions i = 0..b-1) with start state (P0, S0) and every gradient
G_s = grad l(P0; k_s, v_s) taken at P0 (mini-batch gradient descent, Titans eqs. 13-14):

    S_i = eta_i S_{i-1} - theta_i G_i,          P_i = (1 - alpha_i) P_{i-1} + S_i

unrolls to (DESIGN.md sec. 2; seeds 001 sec. 4.3, 002):

    S_i = E_{i,0} S0 - sum_{s<=i} theta_s E_{i,s} G_s
    P_i = B_i P0 + A_i S0 - sum_{s<=i} C_{i,s} G_s

with  B_i = prod_{j<=i} (1 - alpha_j),  E_{i,s} = prod_{s<j<=i} eta_j,  E_{i,0} = prod_{j<=i} eta_j,
D_{i,k} = B_i / B_k = prod_{k<j<=i} (1 - alpha_j),  A_i = sum_{k<=i} D_{i,k} E_{k,0},
C_{i,s} = theta_s sum_{s<=k<=i} D_{i,k} E_{k,s},  i.e.  C = (D @ E) * theta  (lower-triangular).

The segment products D and E come from prefix sums of log-gates, masked before the exp (never as
ratios B_i / B_k of running products, which overflow or divide by a vanishing product). Gates
that are exactly 0 (momentum off: eta = 0; a saturated float32 sigmoid: alpha = 1) are counted
rather than logged, so the products through them are exact zeros, with exact derivatives (see
:func:`segment_products`). The entries above the diagonal are exact zeros, so nothing at a later
position reaches an earlier one.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class ChunkCoefficients(NamedTuple):
    """Coefficients of one chunk (b tokens); shapes [b] or [b, b], dtype of the gates.

    B: [b] decay of the chunk-start parameters, B_i.
    A: [b] weight of the chunk-start momentum in P_i, A_i.
    C: [b, b] weight of G_s in P_i, C[i, s] (zero for s > i).
    E0: [b] weight of the chunk-start momentum in S_i, E_{i,0}.
    M: [b, b] weight of G_s in S_i, theta_s E_{i,s} (zero for s > i).
    """

    B: jax.Array
    A: jax.Array
    C: jax.Array
    E0: jax.Array
    M: jax.Array


def _segment_parts(g):
    b = g.shape[0]
    idx = jnp.arange(b)
    lower = idx[:, None] >= idx[None, :]
    tri = lower.astype(g.dtype)                              # prefix sums as one matmul
    zero = g < jnp.finfo(g.dtype).tiny                       # exact zeros (and subnormals)
    safe = jnp.where(zero, jnp.ones((), g.dtype), g)
    cum = tri @ jnp.log(safe)                                # sum_{j<=i} log g_j over non-zero g_j
    n_zero = tri @ zero.astype(g.dtype)
    seg_zeros = n_zero[:, None] - n_zero[None, :]            # zeros in (k, i]
    seg_log = jnp.where(lower, cum[:, None] - cum[None, :], 0)   # masked before the exp
    nonzero_prod = jnp.where(lower, jnp.exp(seg_log), 0)     # product of the non-zero factors
    prods = jnp.where(seg_zeros == 0, nonzero_prod, 0)
    return prods, (lower, tri, zero, safe, seg_zeros, nonzero_prod)


@jax.custom_jvp
def segment_products(g: jax.Array) -> jax.Array:
    """P[i, k] = prod_{k < j <= i} g_j for i >= k (1 on the diagonal), 0 for i < k.

    Computed from prefix sums of log g, masked before the exp; a factor that is exactly 0 is
    counted instead of logged, so products through it are exact zeros. The derivative is exact
    too, including with respect to a factor that is exactly 0 (custom JVP: d P[i, k] =
    P[i, k] sum_{k<j<=i} dg_j / g_j without zeros, the product of the other factors times dg_z
    with one zero z, and 0 with two or more).

    Args:
      g: [b] factors (gates) >= 0, any float dtype.
    Returns:
      [b, b] lower-triangular matrix of products of g over the half-open segments (k, i].
    """
    return _segment_parts(g)[0]


@segment_products.defjvp
def _segment_products_jvp(primals, tangents):
    (g,), (dg,) = primals, tangents
    prods, (lower, tri, zero, safe, seg_zeros, nonzero_prod) = _segment_parts(g)
    rel = tri @ jnp.where(zero, 0, dg / safe)                # sum_{j<=i} dg_j / g_j, non-zero j
    dz = tri @ jnp.where(zero, dg, 0)                        # sum_{j<=i} dg_j, zero j
    d_prods = jnp.where(seg_zeros == 0, prods * (rel[:, None] - rel[None, :]),
                        jnp.where(seg_zeros == 1, nonzero_prod * (dz[:, None] - dz[None, :]), 0))
    return prods, jnp.where(lower, d_prods, 0)


def chunk_coefficients(theta: jax.Array, eta: jax.Array, alpha: jax.Array) -> ChunkCoefficients:
    """Closed-form coefficients of one chunk from its per-token gates.

    Args:
      theta: [b] inner learning rates theta_s (Titans eq. 13).
      eta: [b] momentum decays eta_i (eq. 13).
      alpha: [b] forget gates alpha_i (eq. 14).
    Returns:
      ChunkCoefficients (see the module docstring for the formulas).
    """
    keep = 1 - alpha
    D = segment_products(keep)       # D[i, k] = B_i / B_k
    E = segment_products(eta)        # E[k, s] = E_{k,s}
    B = D[:, 0] * keep[0]            # B_i = prod_{j<=i} (1 - alpha_j)
    E0 = E[:, 0] * eta[0]            # E_{i,0} = prod_{j<=i} eta_j
    A = D @ E0
    C = (D @ E) * theta[None, :]
    M = E * theta[None, :]
    return ChunkCoefficients(B=B, A=A, C=C, E0=E0, M=M)
