"""In-kernel math of one chunk of the memory recurrence, shared by the Pallas kernels (GPU and TPU).

Everything here runs inside a Pallas kernel body on values and refs of one chunk of b tokens and
one head. It is the dual form of :mod:`titans_lm.memory.chunked` (docs/design.md#the-chunked-dual-form; Titans
arXiv:2501.00663 eqs. 13-14 with mini-batch size b; TTT arXiv:2407.04620 sec. 2.5), written with
only the operations both Pallas lowerings (Triton, Mosaic TPU) support: 2-D matmuls
(``lax.dot_general``), iota, elementwise math, ``where`` and row/column sums. No transposes
of values, no cumulative ops, no slicing of values: a quantity needed both as a row [1, b] and a
column [b, 1] is built in each orientation from the gates, which the kernels load in both.

Gate matrices from sums of logs, masked before the exp. With l_j = log(1 - alpha_j) (the kernel
receives the forget gate in this log form) and e_j = log(eta_j) (both clamped at log(tiny) so
that a gate of exactly 0 gives a product of ~1e-38, i.e. 0 in float32, instead of log(0)):

    D[i, k] = exp(sum_{k<m<=i} l_m)   (i >= k, else 0)      = B_i / B_k
    E[i, s] = exp(sum_{s<m<=i} e_m)   (i >= s, else 0)      = E_{i,s}

Each segment sum is formed directly as a matmul of masked logs, ``(mask_le * l) @ mask_gt``, and
not as a difference of running sums, so a clamped log(0) = -87 never cancels against another and
the products stay exact to rounding. Then (coefficients.py, same notation):

    B_i = exp(sum_{m<=i} l_m), E0_i = exp(sum_{m<=i} e_m), A_i = sum_k D[i,k] E0_k,
    C = (D @ E) * theta[None, :] * read_scale[:, None]     (read_scale: 1, or TTT's b / (i + 1))

and for the state after the chunk's last real token (index last; the padding after it has
theta = 0, eta = 1, alpha = 0, so products over padding are 1):

    B_end = B_last, E0_end = E0_last, A_end = sum_{k<=last} D[last,k] E0_k,
    C_end[s] = theta_s sum_{s<=k<=last} D[last,k] E[k,s],   M_end[s] = theta_s E[last,s].

Reads after token i's write through a weight matrix applied as u @ W (layer input u at the chunk
start state P0, back-propagated signal d, read input r):

    r W_i = B_i (r W0) + A_i (r S0) - ((C * (r u^T)) @ d)_i,
    W_end = B_end W0 + A_end S0 - u^T (C_end * d),   S_end = E0_end S0 - u^T (M_end * d).

All arithmetic is in the compute dtype (float32; float64 in interpret mode) whatever the input
dtype; the coefficient matmuls are float32-accurate (``Precision.HIGHEST``; three TF32 passes in
the compiled Triton kernel).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

HIGHEST = lax.Precision.HIGHEST

# Row indices of the packed per-chunk gate array [8, b] (and columns of its transpose [b, 8]):
# theta, eta, the forget gate as log(1 - alpha), the reset flag, the read scale (TTT's running
# mean b / (i + 1), else 1).
ROW_THETA, ROW_ETA, ROW_LOG_KEEP, ROW_RESET, ROW_READ_SCALE = 0, 1, 2, 3, 4
GATE_ROWS = 8


def mm(a, b, precision=HIGHEST):
    """a @ b for 2-D a [m, k], b [k, n]."""
    return lax.dot_general(a, b, (((1,), (0,)), ((), ())), precision=precision,
                           preferred_element_type=a.dtype)


def mm_tn(a, b, precision=HIGHEST):
    """a^T @ b for a [k, m], b [k, n] (contract the leading axes)."""
    return lax.dot_general(a, b, (((0,), (0,)), ((), ())), precision=precision,
                           preferred_element_type=a.dtype)


def mm_nt(a, b, precision=HIGHEST):
    """a @ b^T for a [m, k], b [n, k] (contract the trailing axes)."""
    return lax.dot_general(a, b, (((1,), (1,)), ((), ())), precision=precision,
                           preferred_element_type=a.dtype)


class ChunkGates(NamedTuple):
    """The gates of one chunk in both orientations (rows [1, b], columns [b, 1]), compute dtype.

    log_keep: log(1 - alpha); read_scale_c: [b, 1] scale of the gradient terms of read i.
    """

    theta_r: jax.Array
    eta_r: jax.Array
    log_keep_r: jax.Array
    theta_c: jax.Array
    eta_c: jax.Array
    log_keep_c: jax.Array
    read_scale_c: jax.Array


class KernelCoefficients(NamedTuple):
    """Dual-form coefficients of one chunk (see the module docstring).

    B, A: [b, 1]; C: [b, b]; B_end, A_end, E0_end: [1, 1]; C_end, M_end: [b, 1].
    """

    B: jax.Array
    A: jax.Array
    C: jax.Array
    B_end: jax.Array
    A_end: jax.Array
    E0_end: jax.Array
    C_end: jax.Array
    M_end: jax.Array


class KernelRefs(NamedTuple):
    """The refs of one kernel call, in the order both kernels (GPU and TPU) receive them.

    Inputs: k, v, q, the gate rows and columns, then the state the sequence starts from
    (P0: parameters, S0: momentum) and R (reset flags per chunk), n_params refs each. Outputs:
    reads, the final state (P, S), and with ``save_states`` the chunk-group boundary states
    (bnd_P, bnd_S; empty tuples otherwise).
    """
    k: object
    v: object
    q: object
    rows: object
    cols: object
    P0: tuple
    S0: tuple
    R: tuple
    reads: object
    P: tuple
    S: tuple
    bnd_P: tuple
    bnd_S: tuple


def split_refs(refs: Sequence, n_params: int, save_states: bool) -> KernelRefs:
    """Name the flat ``refs`` of a kernel body (see :class:`KernelRefs`)."""
    n = n_params
    k, v, q, rows, cols = refs[:5]
    rest = tuple(refs[5:])

    def group(i):  # the i-th run of n refs; the single reads ref sits between runs 2 and 3
        start = i * n + (1 if i >= 3 else 0)
        return rest[start:start + n]

    return KernelRefs(k, v, q, rows, cols, group(0), group(1), group(2), rest[3 * n], group(3),
                      group(4), group(5) if save_states else (), group(6) if save_states else ())


def split_outputs(outs: Sequence, n_params: int, save_states: bool) -> tuple:
    """Name the flat outputs of a kernel call: (reads, P, S, bnd_P, bnd_S) as in
    :class:`KernelRefs` (bnd_P and bnd_S empty tuples without ``save_states``)."""
    n = n_params
    group = lambda i: tuple(outs[1 + i * n:1 + (i + 1) * n])  # noqa: E731
    return (outs[0], group(0), group(1), group(2) if save_states else (),
            group(3) if save_states else ())


def _safe_log(g):
    return jnp.log(jnp.maximum(g, jnp.finfo(g.dtype).tiny))


def kernel_coefficients(gates: ChunkGates, valid_r: jax.Array,
                        precision=HIGHEST) -> KernelCoefficients:
    """Coefficients of one chunk from its gates.

    Args:
      gates: ChunkGates of the chunk (padding positions: theta 0, eta 1, alpha 0).
      valid_r: bool [1, b], True at the chunk's real tokens (a prefix).
      precision: of the b x b matmuls that form the log segment sums and C (HIGHEST, or
        DotAlgorithmPreset.TF32_TF32_F32_X3 on Triton: the 0/1 masks are exact in TF32 and the
        three passes carry the logs to ~2^-22 relative).
    Returns:
      KernelCoefficients in the gates' dtype.
    """
    b = gates.theta_r.shape[1]
    dt = gates.theta_r.dtype
    i = lax.broadcasted_iota(jnp.int32, (b, b), 0)
    j = lax.broadcasted_iota(jnp.int32, (b, b), 1)
    zero = jnp.zeros((), dt)
    one = jnp.ones((), dt)
    neg_inf = jnp.full((), -jnp.inf, dt)
    log_tiny = jnp.log(jnp.finfo(dt).tiny)
    lk_r, lk_c = jnp.maximum(gates.log_keep_r, log_tiny), jnp.maximum(gates.log_keep_c, log_tiny)
    le_r, le_c = _safe_log(gates.eta_r), _safe_log(gates.eta_c)

    lower = j <= i                                             # [i, m]: m <= i
    gt = jnp.where(j < i, one, zero)                           # [m, k]: m > k
    keep_lower = jnp.where(lower, lk_r, zero)                  # [i, m] = [m <= i] l_m
    eta_lower = jnp.where(lower, le_r, zero)
    D = jnp.exp(jnp.where(lower, mm(keep_lower, gt, precision), neg_inf))  # D[i, k]
    E = jnp.exp(jnp.where(lower, mm(eta_lower, gt, precision), neg_inf))   # E[i, s]
    B = jnp.exp(jnp.sum(keep_lower, axis=1, keepdims=True))    # [b, 1]
    E0_r = jnp.exp(jnp.sum(jnp.where(i <= j, le_c, zero), axis=0, keepdims=True))  # [1, b] over k
    A = jnp.sum(D * E0_r, axis=1, keepdims=True)               # [b, 1]
    C = mm(D, E, precision) * gates.theta_r * gates.read_scale_c           # [b, b]

    # The state after the last real token. D[last, k] = prod_{m > k} (1 - alpha_m) (padding: 1).
    D_end_r = jnp.exp(jnp.sum(jnp.where(i > j, lk_c, zero), axis=0, keepdims=True))  # [1, b]: k
    E_end_c = jnp.exp(jnp.sum(jnp.where(j > i, le_r, zero), axis=1, keepdims=True))  # [b, 1]: s
    # E^T[s, k] = E[k, s] = exp(sum_{s<m<=k} e_m), built directly (no transpose of E).
    after_s = jnp.where(j > i, le_r, zero)                     # [s, m] = [m > s] e_m
    upto_k = jnp.where(i <= j, one, zero)                      # [m, k] = [m <= k]
    ET = jnp.exp(jnp.where(j >= i, mm(after_s, upto_k, precision), neg_inf))
    w_r = jnp.where(valid_r, D_end_r, zero)                    # D[last, k] on real k, else 0
    C_end = gates.theta_c * jnp.sum(ET * w_r, axis=1, keepdims=True)
    M_end = gates.theta_c * E_end_c
    B_end = jnp.exp(jnp.sum(lk_r, axis=1, keepdims=True))      # [1, 1]
    E0_end = jnp.exp(jnp.sum(le_r, axis=1, keepdims=True))
    A_end = jnp.sum(w_r * E0_r, axis=1, keepdims=True)
    return KernelCoefficients(B=B, A=A, C=C, B_end=B_end, A_end=A_end, E0_end=E0_end,
                              C_end=C_end, M_end=M_end)


def load_gates(rows_ref, cols_ref, prefix: tuple, dtype) -> ChunkGates:
    """Gate rows and columns of one chunk from the packed gate refs ([..., 8, b] and [..., b, 8]).

    ``prefix`` indexes the chunk in the refs (``()`` when the kernel sees one chunk's block).
    """
    def row(r):
        return rows_ref[prefix + (pl.ds(r, 1), slice(None))].astype(dtype)

    def col(r):
        return cols_ref[prefix + (slice(None), pl.ds(r, 1))].astype(dtype)

    return ChunkGates(theta_r=row(ROW_THETA), eta_r=row(ROW_ETA), log_keep_r=row(ROW_LOG_KEEP),
                      theta_c=col(ROW_THETA), eta_c=col(ROW_ETA), log_keep_c=col(ROW_LOG_KEEP),
                      read_scale_c=col(ROW_READ_SCALE))


def valid_row(chunk_index, b: int, seq_len: int):
    """bool [1, b]: which positions of chunk ``chunk_index`` are real tokens (< seq_len)."""
    pos = chunk_index * b + lax.broadcasted_iota(jnp.int32, (1, b), 1)
    return pos < seq_len


# ---------------------------------------------------------------------------------- activations
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _silu(x):
    return x * jax.nn.sigmoid(x)


def _silu_grad(x):
    s = jax.nn.sigmoid(x)
    return s * (1 + x * (1 - s))


def _gelu_tanh(x):
    return 0.5 * x * (1 + jnp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))


def _gelu_tanh_grad(x):
    t = jnp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)


# name -> (activation, derivative); the names of titans_lm.memory.inner_models' activations.
KERNEL_ACTIVATIONS: dict[str, tuple[Callable, Callable]] = {
    "silu": (_silu, _silu_grad),
    "gelu_tanh": (_gelu_tanh, _gelu_tanh_grad),
}


# ---------------------------------------------------------------------------------- state tiles
class StateTiles(NamedTuple):
    """How a kernel program walks its part of the memory state, tile by tile.

    index(t) gives, per parameter, the ref index (a tuple of slices / pl.ds) of tile t; ``shapes``
    the tile shape per parameter; ``n`` the number of tiles; ``unroll`` runs the tile loop as a
    Python loop (static indices) rather than a ``lax.fori_loop``.
    """

    index: Callable[[object], tuple]
    shapes: tuple
    n: int
    unroll: bool

    def loop(self, body, carry):
        """carry = body(t, carry) over the tiles."""
        if self.unroll or self.n == 1:
            for t in range(self.n):
                carry = body(t, carry)
            return carry
        return lax.fori_loop(0, self.n, body, carry)


def linear_tiles(d_k: int, col0, block_v: int) -> StateTiles:
    """The linear memory's W [d_k, d_v] (and its momentum): the columns [col0, col0 + block_v)."""
    cols = pl.ds(col0, block_v)
    return StateTiles(index=lambda t: ((slice(None), cols),), shapes=((d_k, block_v),), n=1,
                      unroll=True)


def mlp_tiles(d_k: int, hidden: int, d_v: int, block_h: int, unroll: bool) -> StateTiles:
    """The 2-layer MLP's (W1 [d_k, h], W2 [h, d_v]) cut into hidden tiles of block_h units."""
    def index(t):
        sl = pl.ds(t * block_h, block_h)
        return ((slice(None), sl), (sl, slice(None)))
    return StateTiles(index=index, shapes=((d_k, block_h), (block_h, d_v)), n=hidden // block_h,
                      unroll=unroll)


def copy_state(tiles: StateTiles, src: Sequence, dst: Sequence, src_prefix=(), dst_prefix=()):
    """dst[...] = src[...] for every parameter ref, tile by tile."""
    def body(t, carry):
        for s, d, idx in zip(src, dst, tiles.index(t)):
            d[dst_prefix + idx] = s[src_prefix + idx].astype(d.dtype)
        return carry
    tiles.loop(body, 0)


def zero_state(tiles: StateTiles, dst: Sequence):
    """dst[...] = 0 for every parameter ref, tile by tile."""
    def body(t, carry):
        for d, idx, shape in zip(dst, tiles.index(t), tiles.shapes):
            d[idx] = jnp.zeros(shape, d.dtype)
        return carry
    tiles.loop(body, 0)


def select_state(tiles: StateTiles, flag, src: Sequence, dst: Sequence, zero_dst: Sequence):
    """Where ``flag`` ([1, 1] bool): dst <- src and zero_dst <- 0 (vector form of a reset)."""
    def body(t, carry):
        for s, d, idx in zip(src, dst, tiles.index(t)):
            d[idx] = jnp.where(flag, s[idx].astype(d.dtype), d[idx])
        for z, idx in zip(zero_dst, tiles.index(t)):
            z[idx] = jnp.where(flag, jnp.zeros((), z.dtype), z[idx])
        return carry
    tiles.loop(body, 0)


# ---------------------------------------------------------------------------------- chunk steps
def linear_chunk(k, v, q, P_refs, S_refs, tiles: StateTiles, coef: KernelCoefficients, *,
                 read: str, precision, barrier: Callable[[], None]):
    """One chunk of the linear memory f(x) = x W on the program's tile of W (in place).

    Args:
      k, q: [b, d_k]; v: [b, block_v] (the tile's value columns); compute dtype.
      P_refs, S_refs: 1-tuples of refs holding W and its momentum S [d_k, d_v] (read, then
        overwritten with the chunk-end state).
      tiles: linear_tiles(...) of this program.
      coef: the chunk's coefficients.
      read: "after_write" | "chunk_start".
      precision: matmul precision of the data matmuls.
      barrier: called between the last read and the first write of the state (GPU: a thread
        barrier, since another thread may still be loading what is about to be overwritten).
    Returns:
      reads [b, block_v] in the compute dtype.
    """
    (idx,) = tiles.index(0)
    (P_ref,), (S_ref,) = P_refs, S_refs
    dt = k.dtype
    W = P_ref[idx].astype(dt)
    S = S_ref[idx].astype(dt)
    d = 2 * (mm(k, W, precision) - v)                     # dl_s/dz_s at the chunk start
    if read == "after_write":
        qk = mm_nt(q, k, precision)
        y = (coef.B * mm(q, W, precision) + coef.A * mm(q, S, precision)
             - mm(coef.C * qk, d, precision))
    else:
        y = mm(q, W, precision)
    W_new = coef.B_end * W + coef.A_end * S - mm_tn(k, coef.C_end * d, precision)
    S_new = coef.E0_end * S - mm_tn(k, coef.M_end * d, precision)
    barrier()
    P_ref[idx] = W_new.astype(P_ref.dtype)
    S_ref[idx] = S_new.astype(S_ref.dtype)
    return y


def mlp_chunk(k, v, q, P_refs, S_refs, tiles: StateTiles, coef: KernelCoefficients, *,
              activation: str, read: str, precision, barrier: Callable[[], None]):
    """One chunk of the 2-layer MLP memory f(x) = act(x W1) W2, hidden tile by hidden tile.

    Pass 1 accumulates the chunk-start outputs z2 = sum_t act(k W1_t) W2_t over hidden tiles;
    pass 2 forms per tile the signals d1_t = (d2 W2_t^T) * act'(k W1_t) (d2 = 2 (z2 - v)), the
    layer-1 dual read, the partial layer-2 read, and writes the tile's chunk-end state. The
    layer-2 read's sum over earlier tokens, (C * (h_q h^T)) @ d2, needs h_q h^T summed over all
    tiles and is added after the loop.

    Args:
      k, q: [b, d_k]; v: [b, d_v]; compute dtype.
      P_refs, S_refs: (W1 [d_k, h], W2 [h, d_v]) refs of the parameters and momenta (in place).
      tiles: mlp_tiles(...).
      activation: a key of KERNEL_ACTIVATIONS.
      read, precision, barrier: as in :func:`linear_chunk`.
    Returns:
      reads [b, d_v] in the compute dtype.
    """
    act, act_grad = KERNEL_ACTIVATIONS[activation]
    W1_ref, W2_ref = P_refs
    S1_ref, S2_ref = S_refs
    dt = k.dtype
    b, d_v = v.shape

    def pass1(t, z2):
        i1, i2 = tiles.index(t)
        h = act(mm(k, W1_ref[i1].astype(dt), precision))
        return z2 + mm(h, W2_ref[i2].astype(dt), precision)

    z2 = tiles.loop(pass1, jnp.zeros((b, d_v), dt))
    d2 = 2 * (z2 - v)
    after_write = read == "after_write"
    qk = mm_nt(q, k, precision) if after_write else None
    barrier()

    def pass2(t, carry):
        y, qh = carry
        i1, i2 = tiles.index(t)
        W1, S1 = W1_ref[i1].astype(dt), S1_ref[i1].astype(dt)
        W2, S2 = W2_ref[i2].astype(dt), S2_ref[i2].astype(dt)
        z1 = mm(k, W1, precision)
        h = act(z1)
        d1 = mm_nt(d2, W2, precision) * act_grad(z1)
        if after_write:
            r1 = (coef.B * mm(q, W1, precision) + coef.A * mm(q, S1, precision)
                  - mm(coef.C * qk, d1, precision))
            hq = act(r1)
            y = y + coef.B * mm(hq, W2, precision) + coef.A * mm(hq, S2, precision)
            qh = qh + mm_nt(hq, h, precision)
        else:
            y = y + mm(act(mm(q, W1, precision)), W2, precision)
        W1_new = coef.B_end * W1 + coef.A_end * S1 - mm_tn(k, coef.C_end * d1, precision)
        S1_new = coef.E0_end * S1 - mm_tn(k, coef.M_end * d1, precision)
        W2_new = coef.B_end * W2 + coef.A_end * S2 - mm_tn(h, coef.C_end * d2, precision)
        S2_new = coef.E0_end * S2 - mm_tn(h, coef.M_end * d2, precision)
        barrier()
        W1_ref[i1] = W1_new.astype(W1_ref.dtype)
        S1_ref[i1] = S1_new.astype(S1_ref.dtype)
        W2_ref[i2] = W2_new.astype(W2_ref.dtype)
        S2_ref[i2] = S2_new.astype(S2_ref.dtype)
        return y, qh

    y, qh = tiles.loop(pass2, (jnp.zeros((b, d_v), dt), jnp.zeros((b, b), dt)))
    if after_write:
        y = y - mm(coef.C * qh, d2, precision)
    return y
