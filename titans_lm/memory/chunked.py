"""``chunked``: the memory recurrence as a lax.scan over chunks of its dual form.

Within a chunk every token's gradient is taken at the chunk-start parameters P0 (Titans eqs.
13-14 with mini-batch size b; TTT's mini-batch GD), so all b gradients come from one batched
forward/backward pass at P0. For a weight matrix W that a layer applies as z = u @ W, token s's
gradient is the outer product G_s = u_s^T d_s of the layer input u_s and the back-propagated
signal d_s = dl_s/dz_s, both at P0. A read r_i through that layer at the state after token i is

    r_i W_i = B_i (r_i W0) + A_i (r_i S0) - sum_s C_{i,s} (r_i . u_s) d_s
    R W     = B * (R W0) + A * (R S0) - (C * (R U^T)) D          (matmuls only)

(docs/design.md#the-chunked-dual-form; TTT's dual form, arXiv:2407.04620 sec. 2.5 and appendix A), applied layer by
layer with the read's own activations, so depth-L MLPs are exact as well. Vector parameters
(biases, LayerNorm scale and shift) are small and are materialised per token. No per-token weight
matrix is ever formed. The chunk-end state is one matmul per weight: P_b = B_b P0 + A_b S0 -
U^T diag(C_b) D.

The chunk step (:func:`chunk_step`) is a pure function of (P0, S0, chunk inputs). The scan
computes the gate coefficients (:mod:`titans_lm.memory.coefficients`) of all chunks at once,
outside the sequential loop, since they do not depend on the state, and runs
:func:`chunk_step_from_coefficients` per chunk inside ``jax.checkpoint`` (per group of
``chunks_per_checkpoint`` chunks): the backward pass keeps only group-boundary states and
recomputes the chunk internals. The same functions can serve a backward recompute elsewhere.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from titans_lm.memory.biases import DEFAULT_BIAS, get_bias
from titans_lm.memory.coefficients import ChunkCoefficients, chunk_coefficients, with_running_mean
from titans_lm.memory.delta import delta_chunked_scan
from titans_lm.memory.inner_models import InnerModel, Params, PlainAccess
from titans_lm.memory.newton_schulz import (chunk_states, ns_chunk_coefficients, read_states,
                                            state_after)
from titans_lm.memory.weight_norm import normalize_fast_weights
from titans_lm.memory.omega import (document_ids, extend_rows, extended_windows, omega_mask,
                                    tail_or_empty)


class GradientFactors(NamedTuple):
    """Per-token gradients of a chunk at its start parameters, in factored form.

    inputs: per parameter, for a matrix the layer inputs u [b, d_in] (None for a vector).
    signals: per parameter, for a matrix the signals d [b, d_out] so that G_s = u_s^T d_s; for a
      vector the per-token gradients themselves [b, d].
    """

    inputs: tuple
    signals: tuple


class _ProbeAccess:
    """Evaluates at fixed parameters with a per-token perturbation added after each parameter use.

    The derivative of the summed loss with respect to the perturbation of row s is token s's
    back-propagated signal (matrices) or its gradient (vectors), since loss_s depends on row s only.
    """

    def __init__(self, params, eps):
        self.params, self.eps, self.inputs = params, eps, {}

    def matmul(self, index, h):
        if index in self.inputs:
            raise ValueError(f"inner model uses matrix parameter {index} twice in one forward pass; "
                             "the dual form needs each weight matrix applied once")
        self.inputs[index] = h
        return h @ self.params[index] + self.eps[index]

    def vector(self, index):
        return self.params[index] + self.eps[index]


def gradient_factors(model: InnerModel, params: Params, k: jax.Array, v: jax.Array,
                     bias=DEFAULT_BIAS) -> GradientFactors:
    """Token-wise gradients of l(f(k_s; P), v_s) at ``params``, factored (see GradientFactors).

    l is the attentional bias (:mod:`titans_lm.memory.biases`; "l2": ||f(k_s; P) - v_s||^2): its
    derivative dl/dy is back-propagated through the model's forward pass.

    Args:
      model: inner model spec.
      params: parameter tuple (the chunk-start state P0).
      k: [b, d_k] keys; v: [b, d_v] values.
      bias: the attentional bias: a name or an ``AttentionalBias`` (``get_bias``).
    """
    b = k.shape[0]
    eps = tuple(jnp.zeros((b, p.shape[-1]), k.dtype) for p in params)

    def forward(eps):
        access = _ProbeAccess(params, eps)
        return model.forward(access, k), access.inputs

    y, pullback, inputs = jax.vjp(forward, eps, has_aux=True)
    (signals,) = pullback(get_bias(bias).grad(y, v))
    for i, p in enumerate(params):
        if p.ndim == 2 and i not in inputs:
            raise ValueError(f"inner model never applied matrix parameter {i}")
    return GradientFactors(inputs=tuple(inputs.get(i) for i in range(len(params))),
                           signals=tuple(signals))


def surprise_scale(factors: GradientFactors, max_norm: float) -> jax.Array:
    """[b] factors c_s = min(1, max_norm / ||G_s||) that clip each token's gradient (its momentary
    surprise, over all inner parameters: ||u_s^T d_s||_F = ||u_s|| ||d_s|| for a matrix) to
    ``max_norm``. Scaling token s's gradient by c_s equals scaling theta_s by c_s, so the clip
    multiplies column s of the write coefficients (C, M). ``max_norm <= 0``: ones (no clip)."""
    sq = 0.0
    for u, d in zip(factors.inputs, factors.signals):
        dd = jnp.sum(d * d, axis=-1)
        sq = sq + (dd if u is None else jnp.sum(u * u, axis=-1) * dd)
    if max_norm <= 0:
        return jnp.ones_like(sq)
    over = sq > max_norm ** 2
    norm = jnp.sqrt(jnp.where(over, sq, 1.0))
    return jnp.where(over, max_norm / norm, 1.0)


def clip_surprise(factors: GradientFactors, max_norm: float, coef, ends):
    """(coef, ends) with column s of the write coefficients scaled by :func:`surprise_scale`
    (unchanged for ``max_norm <= 0``; ``coef`` may be None)."""
    if max_norm <= 0:
        return coef, ends
    c = surprise_scale(factors, max_norm)
    ends = ends._replace(C=ends.C * c, M=ends.M * c)
    if coef is not None:
        coef = coef._replace(C=coef.C * c[None, :])
    return coef, ends


class _DualReadAccess:
    """Reads row i through the parameters after token i's write, without materialising them.

    With a reset target R0 (documents starting inside the chunk) the read adds R_i (r R0)."""

    def __init__(self, P0, S0, factors: GradientFactors, coef: ChunkCoefficients,
                 outer: frozenset = frozenset(), reset_to=None, inside=None):
        self.P0, self.S0, self.f, self.c, self.outer = P0, S0, factors, coef, outer
        self.R0 = reset_to if coef.R is not None else None
        self.inside = inside

    def matmul(self, index, r):
        c = self.c
        u, d = self.f.inputs[index], self.f.signals[index]
        out = (c.B[:, None] * (r @ self.P0[index]) + c.A[:, None] * (r @ self.S0[index])
               - (c.C * (r @ u.T)) @ d)
        if self.R0 is None:
            return out
        return when_inside(self.inside, lambda: out + c.R[:, None] * (r @ self.R0[index]),
                           lambda: out)

    def vector(self, index):
        if index in self.outer:
            return self.P0[index]          # outer-loop parameter: not written by the inner loop
        c = self.c
        out = (c.B[:, None] * self.P0[index] + c.A[:, None] * self.S0[index]
               - c.C @ self.f.signals[index])
        if self.R0 is not None:
            out = out + c.R[:, None] * self.R0[index]
        return out


def when_inside(inside, exact, plain):
    """``exact()`` where documents may start inside chunks, ``plain()`` where none does.

    ``inside``: None or True (unknown or yes: exact, no branch), False (plain), or a traced bool
    scalar (``lax.cond``: both compiled, one runs; unbatched under vmap, it stays a branch).
    The two agree when no start is inside a chunk (R = 0, every token's base is P0); plain
    skips the gradients at the reset target and the R0 read matmuls."""
    if inside is None or inside is True:
        return exact()
    if inside is False:
        return plain()
    return jax.lax.cond(inside, exact, plain)


def in_chunk_starts(reset: jax.Array) -> jax.Array:
    """[..., b] bool: the document starts of chunks [..., b] other than at their first token
    (a start there is the chunk-start reset, applied to the state before the chunk)."""
    return reset & (jnp.arange(reset.shape[-1]) > 0)


def starts_inside_chunks(reset: jax.Array, chunk_size: int) -> jax.Array:
    """bool scalar: does any document start inside a chunk (reset at t % chunk_size != 0)?
    ``reset`` has time on its last axis ([T] or [B, T])."""
    return jnp.any(reset & (jnp.arange(reset.shape[-1]) % chunk_size != 0))


def after_start(reset: jax.Array) -> jax.Array:
    """[..., b] bool: tokens at or after a document start of their chunk (their gradient is
    taken at the reset target)."""
    return jnp.cumsum(reset.astype(jnp.int32), axis=-1) > 0


def select_factors(after: jax.Array, at_P0: GradientFactors, at_R0: GradientFactors) -> GradientFactors:
    """Per token: the factors at the reset target where ``after`` ([b] bool), else at P0."""
    pick = lambda a, b: None if a is None else jnp.where(after[:, None], b, a)  # noqa: E731
    return GradientFactors(inputs=tuple(pick(a, b) for a, b in zip(at_P0.inputs, at_R0.inputs)),
                           signals=tuple(pick(a, b) for a, b in zip(at_P0.signals, at_R0.signals)))


class EndRows(NamedTuple):
    """The coefficient rows of a chunk's last valid token: the chunk-end state is
    P_end = B P0 + A S0 - sum_s C_s G_s,  S_end = E0 S0 - sum_s M_s G_s.

    B, A, E0: scalars; C, M: [b]; R: scalar weight of the reset target (P_end gains R R0), or
    None without document starts inside the chunk. For an empty chunk (no valid token) the
    identity (B = E0 = 1, A = R = 0, C = M = 0), so the state passes through unchanged.
    """

    B: jax.Array
    A: jax.Array
    C: jax.Array
    E0: jax.Array
    M: jax.Array
    R: jax.Array | None = None


def end_rows(coef: ChunkCoefficients, n_valid=None) -> EndRows:
    """Rows of ``coef`` for the state after token n_valid - 1 (n_valid None: the full chunk).

    Args:
      coef: the chunk's coefficients.
      n_valid: number of real tokens, int scalar in 0..b (may be traced), or None for b.
    """
    b = coef.B.shape[0]
    last = b - 1 if n_valid is None else jnp.clip(n_valid - 1, 0, b - 1)
    rows = EndRows(B=coef.B[last], A=coef.A[last], C=coef.C[last], E0=coef.E0[last], M=coef.M[last],
                   R=None if coef.R is None else coef.R[last])
    if n_valid is None:
        return rows
    empty = n_valid <= 0
    one, zero = jnp.ones((), coef.B.dtype), jnp.zeros((), coef.B.dtype)
    return EndRows(B=jnp.where(empty, one, rows.B), A=jnp.where(empty, zero, rows.A),
                   C=jnp.where(empty, zero, rows.C), E0=jnp.where(empty, one, rows.E0),
                   M=jnp.where(empty, zero, rows.M),
                   R=None if rows.R is None else jnp.where(empty, zero, rows.R))


def chunk_step_from_coefficients(model: InnerModel, P0: Params, S0: Params, k, v, q,
                                 coef: ChunkCoefficients, ends: EndRows, *, read: str = "after_write",
                                 surprise_max_norm: float = 0.0):
    """The state-dependent part of :func:`chunk_step`, given the chunk's gate coefficients.

    The coefficients depend on the gates only, so a scan can compute them for every chunk at once
    (batched, outside the sequential loop) and keep the loop body to the matmuls. ``coef`` gives
    the reads (with :func:`~titans_lm.memory.coefficients.with_running_mean` applied for TTT's
    running-mean reads), ``ends`` the chunk-end state. Outer-loop parameters of the model
    (:meth:`~titans_lm.memory.inner_models.InnerModel.outer_params`) pass through unchanged.
    ``surprise_max_norm > 0`` clips each token's gradient at P0 to that norm
    (:func:`surprise_scale`; the guard ``MemoryConfig.surprise_max_norm``).

    Returns:
      (reads [b, d_v], P_end, S_end).
    """
    factors = gradient_factors(model, P0, k, v)
    outer = model.outer_params()
    coef, ends = clip_surprise(factors, surprise_max_norm, coef, ends)
    if read == "after_write":
        reads = model.forward(_DualReadAccess(P0, S0, factors, coef, outer), q)
    else:
        reads = model.forward(PlainAccess(P0), q)
    P_end, S_end = end_state(P0, S0, factors, ends, outer)
    return reads, P_end, S_end


def end_state(P0: Params, S0: Params, factors: GradientFactors, ends: EndRows,
              outer: frozenset = frozenset(), reset_to: Params | None = None):
    """(P_end, S_end) of a chunk from its start state, gradient factors and end rows:
    P_end = B P0 + A S0 - sum_s C_s G_s,  S_end = E0 S0 - sum_s M_s G_s (one matmul per weight),
    plus R reset_to when the end rows have R (documents starting inside the chunk); the
    parameters listed in ``outer`` (outer-loop ones) pass through unchanged."""
    P_end, S_end = [], []
    for i, (p0, s0, u, d) in enumerate(zip(P0, S0, factors.inputs, factors.signals)):
        if i in outer:
            P_end.append(p0)
            S_end.append(s0)
            continue
        if p0.ndim == 2:
            gP = u.T @ (ends.C[:, None] * d)
            gS = u.T @ (ends.M[:, None] * d)
        else:
            gP = ends.C @ d
            gS = ends.M @ d
        p_end = ends.B * p0 + ends.A * s0 - gP
        P_end.append(p_end if ends.R is None else p_end + ends.R * reset_to[i])
        S_end.append(ends.E0 * s0 - gS)
    return tuple(P_end), tuple(S_end)


def chunk_step(model: InnerModel, P0: Params, S0: Params, k, v, q, theta, eta, alpha,
               n_valid=None, *, read: str = "after_write", running_mean: bool = False,
               log_keep=None):
    """One chunk of the memory recurrence: reads and the state after the chunk's last valid token.

    Args:
      model: inner model spec.
      P0, S0: parameter and momentum tuples at the chunk start.
      k: [b, d_k], v: [b, d_v], q: [b, d_k] the chunk's keys, values and queries.
      theta, eta, alpha: [b] gates.
      n_valid: number of real tokens (int scalar, may be traced; 0..b); the returned state is the
        state after token n_valid - 1 (the chunk start when 0). None means b.
      read: "after_write" reads f(q_i; P_i); "chunk_start" reads f(q_i; P0).
      running_mean: reads at position i scale the gradient terms by b / (i + 1) (TTT's 1/i;
        :func:`~titans_lm.memory.coefficients.running_mean_scale`); the state is unchanged.
      log_keep: optional [b] log(1 - alpha), used instead of alpha.
    Returns:
      (reads [b, d_v], P_end, S_end).
    """
    coef = chunk_coefficients(theta, eta, alpha, log_keep=log_keep)
    ends = end_rows(coef, n_valid)
    if running_mean:
        coef = with_running_mean(coef)
    return chunk_step_from_coefficients(model, P0, S0, k, v, q, coef, ends, read=read)


def _pad_rows(x, total, value):
    pad = total - x.shape[0]
    if pad == 0:
        return x
    widths = [(0, pad)] + [(0, 0)] * (x.ndim - 1)
    return jnp.pad(x, widths, constant_values=value)


def chunked_scan(params0, momentum0, k, v, q, theta, eta, alpha, reset, *, model: InnerModel,
                 chunk_size: int, read: str, reset_to, chunks_per_checkpoint: int = 1,
                 running_mean: bool = False, log_keep=None, state_length=None,
                 surprise_max_norm: float = 0.0, inside_starts=None,
                 attentional_bias=DEFAULT_BIAS, gradient_at: str = "chunk_start",
                 decay_target: str = "zero", ns_steps: int = 0, ns_gradient: str = "exact",
                 fast_weight_norm: bool = False, omega_window: int = 1, gamma=None,
                 omega_tail=None, omega_normalize: bool = False, no_momentum: bool = False,
                 no_decay: bool = False):
    """The ``chunked`` implementation of :func:`titans_lm.memory.memory_scan` (validated inputs).

    ``gradient_at="previous_token"`` (online gradient descent, each token's gradient at the
    decayed state just before its write: Gated DeltaNet) runs the chunkwise WY form of
    :func:`titans_lm.memory.delta.delta_chunked_scan` instead of the dual form below.

    The sequence is cut into ceil(T / chunk_size) chunks; the last one is padded with zero keys,
    values and queries and theta = 0 (eta = 1, alpha = 0), its padded reads are dropped, and the
    final state is read off the coefficient row of the last real token, so padding changes nothing.
    ``chunks_per_checkpoint`` chunks form one ``jax.checkpoint`` group (the chunk count is padded
    with empty chunks that leave the state unchanged): the backward pass stores one state per group
    and recomputes the chunk internals. ``chunks_per_checkpoint=0`` turns that off: the backward
    keeps every chunk's internals (no forward recompute; memory grows with T by those internals).

    With ``state_length`` L the scan also carries the state after token L - 1: in chunk c the
    coefficient row of token min(L - c b, b) - 1 gives it from the same gradient factors (one
    more matmul per weight and chunk), kept while c b < L; the initial state for L = 0.

    Args:
      chunks_per_checkpoint: chunks per rematerialisation group (>= 1), or 0 for none.
      running_mean: TTT's running-mean reads (see :func:`chunk_step`).
      log_keep: optional [T] log(1 - alpha), used instead of alpha (padded with 0).
      state_length: None (the state after all T tokens) or an int scalar in 0..T, may be traced.
      surprise_max_norm: clip each token's gradient to this norm (0: off; see
        :func:`surprise_scale`).
      inside_starts: whether any document starts inside a chunk (:func:`starts_inside_chunks`):
        None (unknown: the exact path), a Python bool (False skips the work of such starts), or
        a traced bool scalar (a branch per chunk, :func:`when_inside`). Must be true when one
        does; the layer computes it over the whole batch.
      attentional_bias: the inner loss (:mod:`titans_lm.memory.biases`): a name or an
        ``AttentionalBias``.
      gradient_at: "chunk_start" (the dual form) or "previous_token" (the WY form).
      decay_target: "zero" (Titans eq. 14) or "initial": the forget gate decays the state toward
        ``reset_to`` (the coefficients' R = 1 - B, :func:`chunk_coefficients`), so every read and
        chunk end adds R_i times the target.
      ns_steps: k > 0 runs Atlas' Muon rule (Newton-Schulz steps on the momentum): each chunk's
        per-token states are materialised (:func:`titans_lm.memory.newton_schulz.chunk_states`,
        O(chunk_size d_in d_out) memory per weight matrix) instead of the dual form; not with
        ``running_mean``. 0: the dual form.
      ns_gradient: "exact" or "straight_through", NS_k's backward
        (:func:`titans_lm.memory.newton_schulz.orthogonalise`).
      fast_weight_norm: LaCT's weight normalisation (:mod:`titans_lm.memory.weight_norm`): each
        chunk-end state's weight matrices are rescaled to ``reset_to``'s column norms (one
        rescale per matrix and chunk), and so is the state kept at ``state_length`` L >= 1. The
        reads inside a chunk (``read="after_write"``) see the states before it; a chunk-start
        read never sees an unnormalised state. A mini-batch that a document start ends inside a
        chunk is discarded by the reset, so only its kept state (L at the start) shows its
        normalisation.
      omega_window: c >= 1, Atlas' Omega rule for c > 1 (:mod:`titans_lm.memory.omega`): each
        chunk's gradient factors are taken over its extended token set [c - 1 tokens before it
        || its b tokens] (the tokens before token 0 from ``omega_tail``) and every coefficient
        row of the writes becomes C @ Wmask (:func:`~titans_lm.memory.omega.omega_mask`).
      gamma: [T] the Omega gates in [0, 1] (with omega_window > 1 only).
      omega_tail: None (a fresh stream) or (k [c - 1, d_k], v [c - 1, d_v], gamma [c - 1],
        valid bool [c - 1]) of the c - 1 tokens before token 0 (valid: in the document that
        continues at token 0).
      omega_normalize: every row of Wmask divided by its sum (the window's gates-weighted mean).
      no_momentum: eta is 0 at every token (``eta`` is then ignored): the coefficients are
        formed without the momentum's [b, b] products (:func:`chunk_coefficients` with eta None).
      no_decay: alpha is 0 at every token (``alpha`` and ``log_keep`` are then ignored): the
        decay products are the document mask (:func:`chunk_coefficients` with alpha None).
    Raises:
      ValueError: for chunks_per_checkpoint < 0, or ns_steps > 0 with running_mean.
    """
    if gradient_at == "previous_token":
        return delta_chunked_scan(params0, momentum0, k, v, q, theta, eta, alpha, reset,
                                  model=model, chunk_size=chunk_size, read=read,
                                  reset_to=reset_to, chunks_per_checkpoint=chunks_per_checkpoint,
                                  log_keep=log_keep, state_length=state_length)
    if int(chunks_per_checkpoint) != chunks_per_checkpoint or chunks_per_checkpoint < 0:
        raise ValueError(f"chunks_per_checkpoint must be an integer >= 0 (0: no rematerialisation), "
                         f"got {chunks_per_checkpoint}")
    if ns_steps and running_mean:
        raise ValueError("ns_steps > 0 (Newton-Schulz momentum) does not take running_mean (TTT's "
                         "running-mean reads); turn one of them off")
    remat = chunks_per_checkpoint > 0
    T = k.shape[0]
    b = chunk_size
    n_chunks = math.ceil(T / b)
    g = min(max(int(chunks_per_checkpoint), 1), n_chunks)
    n_groups = math.ceil(n_chunks / g)
    total = n_groups * g * b

    dt = k.dtype
    k_p, v_p, q_p = (_pad_rows(x, total, 0) for x in (k, v, q))
    theta_p = _pad_rows(theta, total, 0)
    eta_p = _pad_rows(eta, total, 1)
    alpha_p = _pad_rows(alpha, total, 0)
    reset_p = _pad_rows(reset, total, False)
    n_valid = np.clip(T - np.arange(n_groups * g) * b, 0, b).astype(np.int32)

    # Gate coefficients of every chunk at once: they do not depend on the state, so they stay
    # out of the sequential loop (batched over chunks, forward and backward). A document start at
    # a chunk's first token resets the state before the chunk; one inside it cuts the chunk
    # (chunk_coefficients' reset; docs/design.md#resets-inside-a-chunk).
    per_chunk = lambda x: x.reshape((n_groups * g, b) + x.shape[1:])  # noqa: E731
    inside = None if inside_starts is False else in_chunk_starts(per_chunk(reset_p))
    to_target = decay_target == "initial"
    coefficients = ns_chunk_coefficients if ns_steps else chunk_coefficients
    # gates that are None are constant zeros (no momentum / no decay): no products for them
    et_c = None if no_momentum else per_chunk(eta_p)
    if no_decay:
        al_c = lk_c = None
    elif log_keep is None:
        al_c, lk_c = per_chunk(alpha_p), None
    else:
        al_c, lk_c = None, per_chunk(_pad_rows(log_keep, total, 0))
    coef = jax.vmap(lambda th, et, al, lk, rs: coefficients(
        th, et, al, log_keep=lk, reset=rs, decay_to_target=to_target))(
        per_chunk(theta_p), et_c, al_c, lk_c, inside)
    # the dual form's end rows; materialised Newton-Schulz states pick a row by token count
    ends = jnp.asarray(n_valid) if ns_steps else jax.vmap(end_rows)(coef, jnp.asarray(n_valid))
    # Inside the loop each token picks the base of its gradient: P0, or the reset target from a
    # document start on (after_start). The factors at the target are recomputed per chunk inside
    # the checkpointed body rather than stored for every token.
    after = None if inside is None else after_start(inside)
    keeping = state_length is not None
    if keeping:
        starts = jnp.arange(n_groups * g, dtype=jnp.int32) * b
        length = jnp.clip(jnp.asarray(state_length, jnp.int32), 0, T)
        keep_ends = jnp.clip(length - starts, 0, b)
        if not ns_steps:
            keep_ends = jax.vmap(end_rows)(coef, keep_ends)
        keep_flags = starts < length
    else:
        keep_ends = keep_flags = None
    if running_mean:
        coef = with_running_mean(coef, inside)
    if read != "after_write" and not ns_steps:
        coef = None   # the chunk-start read needs no coefficients inside the chunk
    k_x, v_x = per_chunk(k_p), per_chunk(v_p)
    if omega_window > 1:
        # Atlas' Omega rule: every write row over the extended token set (titans_lm.memory.omega)
        c = omega_window
        n_all = n_groups * g
        tk, tv, tg, tvalid = tail_or_empty(omega_tail, c, k.shape[1], v.shape[1], dt)
        ext = lambda tail, x: extended_windows(jnp.concatenate([tail, x]), n_all, b, c)  # noqa: E731
        k_x, v_x = ext(tk, k_p), ext(tv, v_p)
        mask = jax.vmap(lambda gm, dc: omega_mask(gm, dc, c, omega_normalize))(
            ext(tg, _pad_rows(gamma.astype(dt), total, 0)),
            extended_windows(document_ids(reset_p, tvalid), n_all, b, c))
        widen = lambda rows: None if rows is None else rows._replace(  # noqa: E731
            C=extend_rows(rows.C, mask), M=extend_rows(rows.M, mask))
        if ns_steps:   # materialised momenta: the window mixes the gradients S_t sums (M);
            coef = coef._replace(M=extend_rows(coef.M, mask))   # C weights NS_k(S_t) per token
        else:
            coef, ends, keep_ends = widen(coef), widen(ends), widen(keep_ends)

    def group_shape(x):
        return x.reshape((n_groups, g) + x.shape[1:])

    nonempty = jnp.asarray(n_valid > 0) if fast_weight_norm else None
    xs = (k_x, v_x, per_chunk(q_p), coef, ends,
          reset_p.reshape(n_groups * g, b)[:, 0], keep_ends, keep_flags, after, nonempty)
    xs = jax.tree.map(group_shape, xs)
    zeros = tuple(jnp.zeros_like(m) for m in momentum0)
    outer = model.outer_params()
    reset_to = tuple(reset_to)

    def one_chunk(carry, x):
        (P, S), kept = carry
        kc, vc, qc, cf, ed, rs, ked, kf, af, ne = x
        P = tuple(jnp.where(rs, r, p) for r, p in zip(reset_to, P))
        S = tuple(jnp.where(rs, z, s) for z, s in zip(zeros, S))
        factors = gradient_factors(model, P, kc, vc, attentional_bias)
        if af is not None:
            at_P0 = factors
            # with the Omega window the tokens before the chunk come before any start inside it
            af_x = jnp.concatenate([jnp.zeros((kc.shape[0] - af.shape[0],), bool), af])
            factors = when_inside(inside_starts, lambda: select_factors(
                af_x, at_P0, gradient_factors(model, reset_to, kc, vc, attentional_bias)),
                lambda: at_P0)
        if ns_steps:
            return ns_chunk((P, S), kept, factors, cf, ed, ked, kf, qc, af)
        cf, ed = clip_surprise(factors, surprise_max_norm, cf, ed)
        if keeping:
            _, ked = clip_surprise(factors, surprise_max_norm, None, ked)
        if read == "after_write":
            # decaying toward the target, every read has its R term, start or not
            reads = model.forward(_DualReadAccess(P, S, factors, cf, outer, reset_to,
                                                  True if to_target else inside_starts), qc)
        else:
            reads = chunk_start_reads(P, qc, af)
        if keeping:
            P_k, S_k = end_state(P, S, factors, ked, outer, reset_to)
            if fast_weight_norm:
                P_k = normalize_fast_weights(P_k, reset_to, outer)
            kept = (tuple(jnp.where(kf, a, c) for a, c in zip(P_k, kept[0])),
                    tuple(jnp.where(kf, a, c) for a, c in zip(S_k, kept[1])))
        P_end, S_end = end_state(P, S, factors, ed, outer, reset_to)
        if fast_weight_norm:   # an empty (padding) chunk passes the state through as it is
            P_end = tuple(jnp.where(ne, a, c) for a, c in
                          zip(normalize_fast_weights(P_end, reset_to, outer), P_end))
        return ((P_end, S_end), kept), reads

    def chunk_start_reads(P, qc, af):
        reads = model.forward(PlainAccess(P), qc)
        if af is None:
            return reads
        return when_inside(inside_starts, lambda: jnp.where(
            af[:, None], model.forward(PlainAccess(reset_to), qc), reads), lambda: reads)

    def ns_chunk(state, kept, factors, cf, n_end, n_kept, kf, qc, af):
        # Atlas' Muon rule: every token's state materialised (titans_lm.memory.newton_schulz)
        scale = surprise_scale(factors, surprise_max_norm) if surprise_max_norm > 0 else None
        P_all, S_all = chunk_states(*state, factors, cf, steps=ns_steps, gradient=ns_gradient,
                                       outer=outer, reset_to=reset_to, scale=scale)
        if read == "after_write":
            reads = read_states(model, P_all, qc)
        else:
            reads = chunk_start_reads(state[0], qc, af)
        if keeping:
            P_k, S_k = state_after(P_all, S_all, state, n_kept)
            kept = (tuple(jnp.where(kf, a, c) for a, c in zip(P_k, kept[0])),
                    tuple(jnp.where(kf, a, c) for a, c in zip(S_k, kept[1])))
        return (state_after(P_all, S_all, state, n_end), kept), reads

    state0 = (tuple(params0), tuple(momentum0))
    carry0 = (state0, state0 if keeping else None)
    if g == 1:   # always so without remat (chunks_per_checkpoint=0)
        step = jax.checkpoint(one_chunk, prevent_cse=False) if remat else one_chunk
        xs = jax.tree.map(lambda x: x[:, 0], xs)
    else:
        step = jax.checkpoint(lambda carry, x: jax.lax.scan(one_chunk, carry, x), prevent_cse=False)
    (state, kept), reads = jax.lax.scan(step, carry0, xs)
    reads = reads.reshape(total, reads.shape[-1])[:T].astype(dt)
    return reads, (kept if keeping else state)
