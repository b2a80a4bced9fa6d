"""Scalar coefficients of one chunk of the memory recurrence in closed (dual) form.

Inside a chunk of b tokens (positions i = 0..b-1) with start state (P0, S0) and every gradient
G_s = grad l(P0; k_s, v_s) taken at P0 (mini-batch gradient descent, Titans eqs. 13-14):

    S_i = eta_i S_{i-1} - theta_i G_i,          P_i = (1 - alpha_i) P_{i-1} + S_i

unrolls to (docs/design.md#the-chunked-dual-form):

    S_i = E_{i,0} S0 - sum_{s<=i} theta_s E_{i,s} G_s
    P_i = B_i P0 + A_i S0 - sum_{s<=i} C_{i,s} G_s

with  B_i = prod_{j<=i} (1 - alpha_j),  E_{i,s} = prod_{s<j<=i} eta_j,  E_{i,0} = prod_{j<=i} eta_j,
D_{i,k} = B_i / B_k = prod_{k<j<=i} (1 - alpha_j),  A_i = sum_{k<=i} D_{i,k} E_{k,0},
C_{i,s} = theta_s sum_{s<=k<=i} D_{i,k} E_{k,s},  i.e.  C = (D @ E) * theta  (lower-triangular).

The segment products D and E come from prefix sums of log-gates, masked before the exp (never as
ratios B_i / B_k of running products, which overflow or divide by a vanishing product). Gates
that are exactly 0 (momentum off: eta = 0; a saturated float32 sigmoid: alpha = 1) are counted
rather than logged, so the products through them are exact zeros; the derivatives divide by no
gate, so they are exact for gates of any size, 0 included (:func:`segment_products_tangent`). The
forget gate may come in log form, log(1 - alpha) from its pre-activation
(:func:`log_segment_products`), which keeps the precision that 1 - alpha loses near 0 and 1.
The entries above the diagonal are exact zeros, so nothing at a later position reaches an
earlier one.
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
    R: [b] weight of the reset target in P_i (document starts inside the chunk), or None for a
      chunk without them (then 0).
    """

    B: jax.Array
    A: jax.Array
    C: jax.Array
    E0: jax.Array
    M: jax.Array
    R: jax.Array | None = None


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
    return jnp.where(seg_zeros == 0, nonzero_prod, 0)


@jax.custom_jvp
def segment_products(g: jax.Array) -> jax.Array:
    """P[i, k] = prod_{k < j <= i} g_j for i >= k (1 on the diagonal), 0 for i < k.

    Computed from prefix sums of log g, masked before the exp; a factor that is exactly 0 is
    counted instead of logged, so products through it are exact zeros. The derivative is exact
    too, for factors of any size including exactly 0, and divides by none of them (custom JVP:
    :func:`segment_products_tangent`).

    Args:
      g: [b] factors (gates) >= 0, any float dtype.
    Returns:
      [b, b] lower-triangular matrix of products of g over the half-open segments (k, i].
    """
    return _segment_parts(g)


@segment_products.defjvp
def _segment_products_jvp(primals, tangents):
    (g,), (dg,) = primals, tangents
    prods = segment_products(g)
    return prods, segment_products_tangent(prods, dg)


def segment_products_tangent(prods: jax.Array, dg: jax.Array) -> jax.Array:
    """The tangent of :func:`segment_products` at ``prods`` = P(g) in the direction dg.

    d P[i, k] = sum_{k<j<=i} P[i, j] dg_j P[j-1, k]: the product over (k, i] with factor j
    replaced by its tangent is the product over (k, j-1] times the product over (j, i]. No factor
    is divided by, so the derivative is exact for gates of any size, exactly 0 included (one zero
    factor: the product of the others; two or more: 0), with no cancellation near 0 (the form
    P sum_j dg_j / g_j would lose all precision at g ~ eps * the other terms). One b x b x b matmul
    (b = chunk size), linear in dg, so reverse mode transposes it.

    Args:
      prods: [b, b] segment products P(g).
      dg: [b] tangent of the factors.
    Returns:
      [b, b] lower-triangular tangent.
    """
    below = jnp.concatenate([jnp.zeros_like(prods[:1]), prods[:-1]], axis=0)  # [j, k] = P[j-1, k]
    return jnp.matmul(prods * dg[None, :], below, precision=jax.lax.Precision.HIGHEST)


def log_segment_products(log_g: jax.Array) -> jax.Array:
    """P[i, k] = exp(sum_{k<j<=i} log_g_j) for i >= k (1 on the diagonal), 0 for i < k.

    The factors in log form (the forget gate as log(1 - alpha) = log_sigmoid(-a) from its
    pre-activation a, exact where 1 - alpha would round: alpha -> 0 and alpha -> 1). Every segment
    sum is formed directly as a sum of its own terms (a masked matmul, no difference of running
    sums), so nothing cancels; the derivative follows by automatic differentiation through exp and
    the sums (d P = P * d(segment sum)), with no division. A factor of exactly 0 (log_g = -inf)
    gives exact zeros through it, with zero derivative with respect to that factor's log.

    Args:
      log_g: [b] logs of the factors (<= 0 for gates in [0, 1]; -inf allowed), any float dtype.
    Returns:
      [b, b] lower-triangular matrix of products over the half-open segments (k, i].
    """
    b = log_g.shape[0]
    idx = jnp.arange(b)
    lower = idx[:, None] >= idx[None, :]
    zero = jnp.isneginf(log_g)
    safe = jnp.where(zero, jnp.zeros((), log_g.dtype), log_g)
    terms = jnp.where(lower, safe[None, :], 0)                      # [i, j] = [j <= i] l_j
    after = (idx[:, None] > idx[None, :]).astype(log_g.dtype)       # [j, k] = [j > k]
    seg = jnp.matmul(terms, after, precision=jax.lax.Precision.HIGHEST)
    n_zero = jnp.cumsum(zero.astype(jnp.int32))
    seg_zeros = n_zero[:, None] - n_zero[None, :]
    return jnp.where(lower & (seg_zeros == 0), jnp.exp(jnp.where(lower, seg, 0)), 0)


def running_mean_scale(b: int, dtype=jnp.float32, reset: jax.Array | None = None) -> jax.Array:
    """[b] read scale of TTT's running mean within a mini-batch: b / (j + 1) at position j.

    TTT (Sun et al. 2024, arXiv:2407.04620 sec. 2.5; ttt-lm-jax ``token_idx``) reads row j
    (0-based) of a mini-batch through W0 - eta / (j + 1) sum_{s<=j} grad_s: the mean of the
    gradients so far. The engine's per-token theta already carries 1/b (``ttt_engine_lr``), so the
    read of row j scales the gradient terms by b / (j + 1); the last row (scale 1) and the state
    after the chunk are unchanged.

    With ``reset`` ([..., b] bool, document starts inside the chunk) a document start begins a
    new mini-batch: j counts from the latest start at or before the position (from the chunk
    start where there is none), so b / (j + 1) is the scale of the chunk cut at the start.
    """
    idx = jnp.arange(b)
    if reset is None:
        return b / (idx + 1).astype(dtype)
    last_start = jax.lax.cummax(jnp.where(reset, idx, 0), axis=reset.ndim - 1)
    return b / (idx - last_start + 1).astype(dtype)


def with_running_mean(coef: "ChunkCoefficients", reset: jax.Array | None = None) -> "ChunkCoefficients":
    """The coefficients with the read rows of C scaled by :func:`running_mean_scale`.

    Only the reads inside a chunk change (C is the weight of G_s in read i); the end-of-chunk rows
    (:func:`titans_lm.memory.chunked.end_rows`) must be taken from the unscaled coefficients.
    Works on one chunk ([b, b] C, [b] reset) or a batch of chunks ([N, b, b], [N, b]).
    """
    b = coef.C.shape[-1]
    return coef._replace(C=coef.C * running_mean_scale(b, coef.C.dtype, reset)[..., :, None])


def chunk_coefficients(theta: jax.Array, eta: jax.Array, alpha: jax.Array | None, *,
                       log_keep: jax.Array | None = None,
                       reset: jax.Array | None = None,
                       decay_to_target: bool = False) -> ChunkCoefficients:
    """Closed-form coefficients of one chunk from its per-token gates.

    Document starts inside the chunk (``reset``; docs/design.md#resets-inside-a-chunk): before
    token j with reset_j the state returns to (R0, 0), R0 the reset target, and the chunk is cut
    there, so tokens from j on have their gradients taken at R0 (the caller selects them) and see
    no write from before j. In the closed form that is the same recurrence with the two gates of
    token j that carry the earlier state, 1 - alpha_j and eta_j, set to 0, which zeroes every
    coefficient through j (B, A, E0 and the columns s < j of C and M for rows i >= j: exact zeros,
    as the segment products give them), plus one term for the target:

        P_i = B_i P0 + R_i R0 + A_i S0 - sum_s C_{i,s} G_s,
        R_i = prod_{j(i) <= m <= i} (1 - alpha_m)   (j(i): the latest start at or before i; else 0)

    With ``decay_to_target`` the forget gate decays the state toward the reset target instead of
    toward zero, P_i = (1 - alpha_i) P_{i-1} + alpha_i R0 + S_i
    (docs/design.md#retention-toward-the-initial-state). The target's weights telescope: sum_{m<=i} D_{i,m} alpha_m = 1 - B_i with
    no start before i in the chunk, and with one at j the target enters at j with weight 1 and
    decays toward itself, so R_i = 1 - B_i in both cases (B_i = 0 from a start on).

    Args:
      theta: [b] inner learning rates theta_s (Titans eq. 13).
      eta: [b] momentum decays eta_i (eq. 13), or None for a memory without momentum (eta = 0
        at every token, exactly: then E is the identity, A = E0 = 0, C = D theta and
        M = diag(theta), formed without the [b, b] products).
      alpha: [b] forget gates alpha_i (eq. 14); ignored (may be None) when log_keep is given.
        alpha = log_keep = None: a memory without decay (alpha = 0 at every token, exactly:
        D is the document mask of :func:`document_mask`, B its first column; no segment
        products).
      log_keep: optional [b] log(1 - alpha_i), the forget gate in log form (see
        :func:`log_segment_products`); used instead of alpha when given.
      reset: optional [b] bool, document starts (any position, 0 included).
      decay_to_target: decay toward the reset target R0 instead of zero (R = 1 - B).
    Returns:
      ChunkCoefficients (see the module docstring for the formulas); R is None without ``reset``
      and without ``decay_to_target``.
    """
    no_momentum, no_decay = eta is None, alpha is None and log_keep is None
    b = theta.shape[0]
    dt = theta.dtype
    if no_decay:
        # D is the document mask: 1 where no start lies in (k, i] (O(b^2) elementwise, no matmul)
        D, B = document_mask(b, reset, dt)
        keep = jnp.ones((b,), dt)
    elif log_keep is None:
        keep = 1 - alpha
        cut = keep if reset is None else jnp.where(reset, jnp.zeros((), keep.dtype), keep)
        D = segment_products(cut)        # D[i, k] = B_i / B_k
        B = D[:, 0] * cut[0]             # B_i = prod_{j<=i} (1 - alpha_j)
    else:
        keep = jnp.exp(log_keep)
        cut = log_keep if reset is None else jnp.where(reset, -jnp.inf, log_keep)
        D = log_segment_products(cut)
        B = D[:, 0] * jnp.exp(cut[0])
    if no_momentum:
        # E is the identity: E_{i,0} = 0, A = 0, C = D theta, M = diag(theta) (no products)
        E0 = jnp.zeros((b,), dt)
        A = jnp.zeros((b,), dt)
        C = D * theta[None, :]
        M = jnp.diag(theta)
    else:
        if reset is not None:
            eta = jnp.where(reset, jnp.zeros((), eta.dtype), eta)
        E = segment_products(eta)        # E[k, s] = E_{k,s}
        E0 = E[:, 0] * eta[0]            # E_{i,0} = prod_{j<=i} eta_j
        if no_decay:
            # E is zero across a start (eta cut there), so the sums over k of D[i, k] E[k, s]
            # are running sums of E down its columns, masked to i's document
            A = jnp.cumsum(E0) * B
            C = jnp.cumsum(E, axis=0) * D * theta[None, :]
        else:
            A = D @ E0
            C = (D @ E) * theta[None, :]
        M = E * theta[None, :]
    if decay_to_target:
        R = 1 - B
    elif reset is None:
        R = None
    elif no_decay:
        R = 1 - B                        # 1 from the chunk's first start on
    else:
        R = D @ jnp.where(reset, keep, jnp.zeros((), keep.dtype))
    return ChunkCoefficients(B=B, A=A, C=C, E0=E0, M=M, R=R)


def document_mask(b: int, reset: jax.Array | None = None, dtype=jnp.float32):
    """The segment products of gates that are all 1 but cut at document starts, without products.

    Args:
      b: chunk size.
      reset: optional [b] bool document starts.
      dtype: of the result.
    Returns:
      (D [b, b], B [b]): D[i, k] = 1 for k <= i with no start in (k, i], else 0;
      B[i] = 1 where no start lies in [0, i], else 0.
    """
    idx = jnp.arange(b)
    lower = idx[:, None] >= idx[None, :]
    if reset is None:
        return lower.astype(dtype), jnp.ones((b,), dtype)
    n = jnp.cumsum(reset.astype(jnp.int32))          # starts in [0, i]
    return (lower & (n[:, None] == n[None, :])).astype(dtype), (n == 0).astype(dtype)
