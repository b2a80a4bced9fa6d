"""Online gradient descent on a linear memory, chunk by chunk: the (gated) delta rule in WY form.

``memory_scan(..., gradient_at="previous_token")`` takes every token's gradient at the state just
before its own write, after that token's decay (Gated DeltaNet's order; Yang, Kautz, Hatamizadeh
2024, arXiv:2412.06464, eq. 10). For a linear memory f(k) = k W (W [d_k, d_v], row vectors), the
l2 bias ||k W - v||^2 (no 1/2), a_t = 1 - alpha_t and beta_t = 2 theta_t:

    W_t = a_t W_{t-1} - theta_t grad_W ||k_t (a_t W_{t-1}) - v_t||^2
        = a_t (I - beta_t k_t^T k_t) W_{t-1} + beta_t k_t^T v_t
        = a_t W_{t-1} + k_t^T u_t,        u_t = beta_t (v_t - a_t k_t W_{t-1})     (pseudo-value)

(DeltaNet, Schlag et al. 2021 and Yang et al. 2024, arXiv:2406.06484: a_t = 1; beta = 2 theta,
so DeltaNet's beta = sigmoid(.) is the Titans gate with theta_max 0.5.) The order differs from
Titans' (``gradient_at="chunk_start"`` with chunk size 1), whose gradient is taken at W_{t-1}
before the decay: W_t = a_t W_{t-1} - theta_t grad(W_{t-1}).

Chunkwise form (Yang et al. 2024, sec. 3, the WY / UT transform). In a chunk that starts from W0
with cumulative decays g_i = prod_{j<=i} a_j, unrolling gives W_i = g_i W0 + sum_{j<=i}
(g_i / g_j) k_j^T u_j, so the pseudo-values solve a unit lower-triangular system

    (I + A) U = diag(beta) (V - diag(g) K W0),   A_ij = beta_i (g_i / g_j) (k_i . k_j), j < i
    o_i   = g_i q_i W0 + sum_{j<=i} (g_i / g_j) (q_i . k_j) u_j           (read after the write)
    W_end = g_C W0 + sum_j (g_C / g_j) k_j^T u_j

(:func:`unit_lower_inverse`, recursive block inversion). Decay ratios are exp(L_i - L_j) of log-space cumulative
sums L, masked to j <= i before the exp, so no ratio exceeds 1 and nothing is divided.

Document starts inside a chunk (the engine's contract, docs/design.md#resets-inside-a-chunk): a
start at token r puts the state back to the reset target R0 before r. Tokens from r on form a
segment: their decay ratios to tokens of an earlier segment are 0, and their base is R0 with
g_i = prod_{r<=m<=i} a_m instead of W0, so a segment sees nothing of the document before it.

The momentum returned is the last write's step k_e^T u_e (= -theta_e times its gradient: the
engine's momentum with eta = 0); eta must be 0.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from titans_lm.memory.inner_models import InnerModel, LinearMemory


def check_delta_model(model: InnerModel) -> None:
    """Raise ValueError unless ``model`` is a linear memory without bias (``(W,)``)."""
    if not isinstance(model, LinearMemory) or model.bias:
        raise ValueError(f"gradient_at='previous_token' (the delta rule) needs a linear memory "
                         f"without bias (memory_depth 1, memory_bias False, no residual LN), got "
                         f"{model!r}; use gradient_at='chunk_start' for other memories")


def _pad(x, total, value):
    pad = total - x.shape[0]
    return x if pad == 0 else jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1),
                                      constant_values=value)


def unit_lower_inverse(A):
    """(I + A)^{-1} for a strictly lower-triangular A [b, b], by recursive block inversion:
    for L = [[L11, 0], [L21, L22]], L^{-1} = [[L11^{-1}, 0], [-L22^{-1} L21 L11^{-1}, L22^{-1}]],
    all diagonal blocks of one size at once (log2 b levels of batched matmuls; b padded to a power
    of two with identity rows). As stable as forward substitution, and matmuls only: XLA:CPU's
    triangular-solve custom call inside the chunk scan hung the second call of a train step
    (measured at batch 8 x 4 heads, T = 256).
    """
    b = A.shape[0]
    n = 1 << max(0, (b - 1).bit_length())
    L = jnp.eye(n, dtype=A.dtype).at[:b, :b].add(A)
    inv = jnp.ones((n, 1, 1), A.dtype)                    # the inverses of the 1 x 1 blocks
    s = 1
    while s < n:
        m = n // (2 * s)
        pairs = inv.reshape(m, 2, s, s)
        i11, i22 = pairs[:, 0], pairs[:, 1]
        diag = L.reshape(m, 2 * s, m, 2 * s)[jnp.arange(m), :, jnp.arange(m), :]   # [m, 2s, 2s]
        low = -i22 @ diag[:, s:, :s] @ i11
        inv = jnp.concatenate([jnp.concatenate([i11, jnp.zeros_like(i11)], axis=2),
                               jnp.concatenate([low, i22], axis=2)], axis=1)
        s *= 2
    return inv[0, :b, :b]


def delta_chunk(W, R0, k, v, q, beta, log_keep, starts, *, read: str = "after_write"):
    """One chunk of the gated delta rule in WY form.

    Args:
      W: [d_k, d_v] the state at the chunk start (after a reset at its first token).
      R0: [d_k, d_v] the reset target of document starts inside the chunk.
      k, q: [b, d_k]; v: [b, d_v]; beta: [b] (2 theta); log_keep: [b] log a (<= 0).
      starts: bool [b] document starts inside the chunk (position 0 False).
      read: "after_write" (o_i from W_i) or "chunk_start" (from the chunk's start state, R0 after
        a start: what the token loop's P_start holds).
    Returns:
      (reads [b, d_v], U [b, d_v] pseudo-values, logc [b] log g_i from each segment's base,
      D [b, b] decay ratios g_i / g_j within a segment (0 elsewhere, 1 on the diagonal),
      seg [b] segment index: 0 for the chunk-start base W, > 0 for R0).
    """
    b = k.shape[0]
    idx = jnp.arange(b)
    seg = jnp.cumsum(starts.astype(jnp.int32))
    L = jnp.cumsum(log_keep)
    start = jax.lax.cummax(jnp.where(starts, idx, 0))
    base = jnp.where(seg > 0, (L - log_keep)[start], 0.0)
    logc = L - base
    c = jnp.exp(logc)
    same = (seg[:, None] == seg[None, :]) & (idx[None, :] <= idx[:, None])
    D = jnp.exp(jnp.where(same, L[:, None] - L[None, :], -jnp.inf))
    after = (seg > 0)[:, None]
    KX = jnp.where(after, k @ R0, k @ W)
    rhs = beta[:, None] * (v - c[:, None] * KX)
    A = beta[:, None] * jnp.tril(D, -1) * (k @ k.T)
    U = unit_lower_inverse(A) @ rhs
    QX = jnp.where(after, q @ R0, q @ W)
    if read == "after_write":
        reads = c[:, None] * QX + (D * (q @ k.T)) @ U
    else:
        reads = QX
    return reads, U, logc, D, seg


def delta_state(W, S, R0, k, U, logc, D, seg, n):
    """The state (W_e, S_e) after the first ``n`` tokens of a chunk (n in 0..b, may be traced):
    W_e = g_e X_e + sum_j D_ej k_j^T u_j with X the segment's base; S_e = k_e^T u_e; (W, S) for
    n = 0."""
    b = k.shape[0]
    e = jnp.clip(n - 1, 0, b - 1)
    X = jnp.where(seg[e] > 0, R0, W)
    W_e = jnp.exp(logc[e]) * X + k.T @ (D[e][:, None] * U)
    S_e = jnp.outer(k[e], U[e])
    empty = n <= 0
    return jnp.where(empty, W, W_e), jnp.where(empty, S, S_e)


def delta_chunked_scan(params0, momentum0, k, v, q, theta, eta, alpha, reset, *,
                       model: InnerModel, chunk_size: int, read: str, reset_to,
                       chunks_per_checkpoint: int = 1, log_keep=None, state_length=None):
    """``memory_scan`` with ``gradient_at="previous_token"``: a lax.scan over chunks of
    :func:`delta_chunk` (validated inputs; ``eta`` is 0 and unused).

    The last chunk is padded with zero keys and theta = 0 (a = 1), which write nothing; the state
    after token T - 1 (or ``state_length`` - 1) is read off its row. ``chunks_per_checkpoint > 0``
    recomputes each chunk's internals in the backward pass (``jax.checkpoint`` per chunk).

    Args: as :func:`titans_lm.memory.chunked.chunked_scan` (params0 = (W [d_k, d_v],)).
    Returns:
      (reads [T, d_v], ((W_L,), (S_L,))).
    Raises:
      ValueError: for a model that is not a linear memory without bias.
    """
    del eta
    check_delta_model(model)
    T = k.shape[0]
    b = chunk_size
    n = math.ceil(T / b)
    total = n * b
    dt = k.dtype
    if log_keep is None:
        log_keep = jnp.log(jnp.maximum(1 - alpha, jnp.finfo(dt).tiny))
    per_chunk = lambda x, value: _pad(x, total, value).reshape((n, b) + x.shape[1:])  # noqa: E731
    kc, vc, qc = per_chunk(k, 0), per_chunk(v, 0), per_chunk(q, 0)
    beta = per_chunk(2 * theta, 0)
    lk = per_chunk(log_keep.astype(dt), 0)
    rs = per_chunk(reset, False)
    first = rs[:, 0]
    inside = rs & (jnp.arange(b) > 0)
    starts = jnp.arange(n, dtype=jnp.int32) * b
    n_valid = jnp.asarray(np.clip(T - np.arange(n) * b, 0, b).astype(np.int32))
    keeping = state_length is not None
    if keeping:
        length = jnp.clip(jnp.asarray(state_length, jnp.int32), 0, T)
        n_keep = jnp.clip(length - starts, 0, b)
        keep_flags = starts < length
    else:
        n_keep = keep_flags = jnp.zeros((n,), jnp.int32)
    (R0,) = reset_to
    W0, S0 = params0[0], momentum0[0]

    def one_chunk(carry, x):
        (W, S), kept = carry
        k_, v_, q_, be, lk_, st, f, nv, nk, kf = x
        W = jnp.where(f, R0, W)
        S = jnp.where(f, 0, S)
        reads, U, logc, D, seg = delta_chunk(W, R0, k_, v_, q_, be, lk_, st, read=read)
        end = delta_state(W, S, R0, k_, U, logc, D, seg, nv)
        if keeping:
            W_k, S_k = delta_state(W, S, R0, k_, U, logc, D, seg, nk)
            kept = (jnp.where(kf, W_k, kept[0]), jnp.where(kf, S_k, kept[1]))
        return (end, kept), reads

    step = jax.checkpoint(one_chunk, prevent_cse=False) if chunks_per_checkpoint > 0 else one_chunk
    carry0 = ((W0, S0), (W0, S0) if keeping else None)
    ((W, S), kept), reads = jax.lax.scan(
        step, carry0, (kc, vc, qc, beta, lk, inside, first, n_valid, n_keep, keep_flags))
    reads = reads.reshape(total, reads.shape[-1])[:T].astype(dt)
    if keeping:
        W, S = kept
    return reads, ((W,), (S,))
