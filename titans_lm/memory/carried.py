"""The carried state of a NeuralMemory (``titans_lm.memory.layer``) and how a call runs from it.

A :class:`MemoryState` holds the memory at the START of the current chunk, the chunk's
tokens so far (keys, values, gates, reset flags: at most b - 1 = chunk_size - 1 of them) and the
last conv_kernel - 1 pre-conv projections. A call runs the engine over [buffer || call] from the
chunk-start state with ``state_length`` = the tokens up to the last chunk start, so it returns the
next chunk-start state and buffers the rest: any split of a sequence into calls gives exactly the
mini-batch semantics of one call, and a decode step (T = 1) costs O(chunk_size), constant in the
context. A call with ``stream.fresh`` (a state that has seen no token) skips the buffer and the
tail. A call made only of persistent tokens (segment id -1: ``LanguageModel.init_state``'s
persistent pass, Titans sec. 3.3) leaves its end state as the chunk-start state and as the reset
target: every document then starts from the state the persistent tokens leave, on a chunk grid
that starts at the first real token (what a lone sequence [persistent || document] gives).

With Atlas' Omega rule (``MemoryConfig.omega_window`` c > 1) the state also carries
:class:`OmegaState`: the c - 1 tokens before the chunk start (keys, values, gates gamma and
whether each is in the document that continues there), which the engine takes as its window tail
(``memory_scan``'s ``omega_tail``), and the buffered tokens' gamma. With c = 1 ``omega`` is ()
and the state is what it was without the rule.

Functions: :func:`empty_state` (the state of a stream that has seen nothing), :func:`with_buffer`
([buffer || call], the engine's input), :func:`next_state` (the state after a call) and
:func:`reset_rows` (a row's memory back to the state a document start restores).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class MemoryState(NamedTuple):
    """The carried state of a NeuralMemory (a pytree; b = chunk_size, K = conv_kernel).

    params, momentum: tuples of [B, H, ...] at the start of the current chunk (inner dtype).
    reset_to: tuple of [B, H, ...]: what a document start restores (W0, or the state the
      persistent tokens leave), with zero momentum.
    buf_k, buf_v: [B, H, b - 1, Dh] keys and values of the current chunk's tokens so far;
    buf_theta, buf_eta, buf_log_keep: [B, H, b - 1] their gates, the forget gate as
      log(1 - alpha) (before the padding mask and the per-chunk gate choice); buf_real: bool
      [B, b - 1] non-padding; buf_reset: bool [B, b - 1]
      document starts. Only the first ``n_buf`` entries are meaningful.
    n_buf: int32 [] tokens buffered: the chunk phase, (tokens seen) % b, the same in every row.
    conv_tail: () without conv, else (q, k, v) pre-conv projections of the last K - 1 tokens,
      [B, K - 1, H, Dh] each (compute dtype).
    omega: () (omega_window 1), else the :class:`OmegaState` of Atlas' Omega rule.
    """

    params: tuple
    momentum: tuple
    reset_to: tuple
    buf_k: jax.Array
    buf_v: jax.Array
    buf_theta: jax.Array
    buf_eta: jax.Array
    buf_log_keep: jax.Array
    buf_real: jax.Array
    buf_reset: jax.Array
    n_buf: jax.Array
    conv_tail: tuple
    omega: tuple = ()


class OmegaState(NamedTuple):
    """What the Omega window (c = omega_window > 1) carries across calls (inner dtype).

    tail_k, tail_v: [B, H, c - 1, Dh] keys and values of the c - 1 tokens before the chunk start
      (keys before the feature map, as the buffer keeps them);
    tail_gamma: [B, H, c - 1] their gates gamma (0 for padding);
    tail_valid: bool [B, c - 1] whether each is in the document that continues at the chunk
      start (False for a fresh stream, after a reset and after the persistent pass);
    buf_gamma: [B, H, b - 1] the gates gamma of the buffered tokens (buf_k's).
    """

    tail_k: jax.Array
    tail_v: jax.Array
    tail_gamma: jax.Array
    tail_valid: jax.Array
    buf_gamma: jax.Array


class Tokens(NamedTuple):
    """Per-token engine inputs before the padding mask and the per-chunk gates (time axis 2 for
    [B, H, T, ...] and axis 1 for [B, T])."""

    q: jax.Array       # [B, H, T, Dh]
    k: jax.Array       # [B, H, T, Dh]
    v: jax.Array       # [B, H, T, Dh]
    theta: jax.Array   # [B, H, T]
    eta: jax.Array     # [B, H, T]
    log_keep: jax.Array   # [B, H, T] log(1 - alpha)
    real: jax.Array    # bool [B, T]
    reset: jax.Array   # bool [B, T]
    gamma: jax.Array | None = None   # [B, H, T] the Omega gates (omega_window > 1), else None


_PER_ROW = ("real", "reset")   # Tokens fields with time on axis 1 ([B, T]); the others: axis 2


def _time_axis(name: str) -> int:
    return 1 if name in _PER_ROW else 2

def empty_state(params: tuple, *, chunk_size: int, head_dim: int, inner_dtype,
                conv_tail: tuple = (), omega_window: int = 1) -> MemoryState:
    """The state of a stream that has seen nothing: ``(params, 0)`` at a chunk start, reset to
    ``params``, an empty buffer and the given (zero) conv tail.

    Args:
      params: tuple of [B, H, ...] (W0 broadcast over the batch), inner dtype.
      chunk_size: b. head_dim: Dh. inner_dtype: the dtype of the buffered keys, values, gates.
      conv_tail: () without conv, else the zero (q, k, v) tails [B, K - 1, H, Dh].
      omega_window: c; for c > 1 an empty (all invalid) :class:`OmegaState`.
    """
    B, H = params[0].shape[:2]
    n = chunk_size - 1
    idt = inner_dtype
    omega = ()
    if omega_window > 1:
        c = omega_window - 1
        omega = OmegaState(tail_k=jnp.zeros((B, H, c, head_dim), idt),
                           tail_v=jnp.zeros((B, H, c, head_dim), idt),
                           tail_gamma=jnp.zeros((B, H, c), idt),
                           tail_valid=jnp.zeros((B, c), bool), buf_gamma=jnp.zeros((B, H, n), idt))
    return MemoryState(params=params, momentum=tuple(jnp.zeros_like(p) for p in params),
                       reset_to=params, buf_k=jnp.zeros((B, H, n, head_dim), idt),
                       buf_v=jnp.zeros((B, H, n, head_dim), idt),
                       buf_theta=jnp.zeros((B, H, n), idt), buf_eta=jnp.zeros((B, H, n), idt),
                       buf_log_keep=jnp.zeros((B, H, n), idt), buf_real=jnp.zeros((B, n), bool),
                       buf_reset=jnp.zeros((B, n), bool), n_buf=jnp.zeros((), jnp.int32),
                       conv_tail=tuple(conv_tail), omega=omega)


def with_buffer(state: MemoryState, t: Tokens, n) -> Tokens:
    """[buffer || call] of static length b - 1 + T, the call placed at the dynamic index n."""
    T = t.q.shape[2]
    buf = Tokens(q=jnp.zeros_like(state.buf_k), k=state.buf_k, v=state.buf_v,
                  theta=state.buf_theta, eta=state.buf_eta, log_keep=state.buf_log_keep,
                  real=state.buf_real, reset=state.buf_reset,
                  gamma=state.omega.buf_gamma if t.gamma is not None else None)

    def place(axis):
        def fn(b_, x):
            widths = [(0, 0)] * b_.ndim
            widths[axis] = (0, T)
            return jax.lax.dynamic_update_slice_in_dim(jnp.pad(b_, widths), x.astype(b_.dtype),
                                                       n, axis)
        return fn

    return Tokens(*(None if x is None else place(_time_axis(name))(bf, x)
                    for name, bf, x in zip(Tokens._fields, buf, t)))


def next_state(state: MemoryState, seq: Tokens, P, S, start, prefix, n_next, tail, *,
               inner_dtype) -> MemoryState:
    """Buffer the tokens of seq from ``start`` on (b - 1 slots); a persistent pass makes its
    end state the chunk-start state and the reset target, with an empty buffer. With the Omega
    window (``seq.gamma`` given) the window tail becomes the c - 1 tokens before ``start``
    (:func:`next_omega`)."""
    nb = state.buf_real.shape[1]   # b - 1

    def window(x, axis):
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, nb)
        return jax.lax.dynamic_slice_in_dim(jnp.pad(x, widths), start, nb, axis)

    w = Tokens(*(None if x is None else window(x, _time_axis(name))
                 for name, x in zip(Tokens._fields, seq)))
    reset_to = tuple(jnp.where(prefix, p, r) for p, r in zip(P, state.reset_to))
    idt = inner_dtype
    return MemoryState(params=tuple(P), momentum=tuple(S), reset_to=reset_to,
                       buf_k=w.k.astype(idt), buf_v=w.v.astype(idt),
                       buf_theta=w.theta.astype(idt), buf_eta=w.eta.astype(idt),
                       buf_log_keep=w.log_keep.astype(idt), buf_real=w.real, buf_reset=w.reset,
                       n_buf=jnp.where(prefix, 0, n_next).astype(jnp.int32),
                       conv_tail=tuple(tail),
                       omega=() if seq.gamma is None else next_omega(
                           state.omega, seq, start, prefix, w.gamma.astype(idt)))


def next_omega(omega: OmegaState, seq: Tokens, start, prefix, buf_gamma) -> OmegaState:
    """The window tail before seq's token ``start`` (the next chunk start): the last c - 1 tokens
    of [tail || seq] before it, each valid when it is in the document that continues at
    ``start`` (valid in the old tail, no document start after it up to ``start`` - 1), none
    after a persistent pass (``prefix``). Padding keeps gamma 0."""
    n = omega.tail_valid.shape[1]          # c - 1
    idt = omega.tail_k.dtype

    def tail(old, x, axis):
        full = jnp.concatenate([old, x.astype(old.dtype)], axis=axis)
        return jax.lax.dynamic_slice_in_dim(full, start, n, axis)

    gamma = jnp.where(seq.real[:, None, :], seq.gamma, 0).astype(idt)
    resets = jnp.concatenate([jnp.zeros_like(omega.tail_valid, jnp.int32),
                              seq.reset.astype(jnp.int32)], axis=1)
    after = jnp.cumsum(resets[:, ::-1], axis=1)[:, ::-1] - resets   # starts after each position
    ok = jnp.concatenate([omega.tail_valid, jnp.ones_like(seq.reset)], axis=1)
    # starts after position p up to start + n - 1 (the last tail token): after[p] - after[last]
    last = jax.lax.dynamic_slice_in_dim(after, start + n - 1, 1, 1)
    p_after = jax.lax.dynamic_slice_in_dim(after, start, n, 1)
    p_ok = jax.lax.dynamic_slice_in_dim(ok, start, n, 1)
    valid = p_ok & (p_after == last) & ~prefix
    return OmegaState(tail_k=tail(omega.tail_k, seq.k, 2), tail_v=tail(omega.tail_v, seq.v, 2),
                      tail_gamma=tail(omega.tail_gamma, gamma, 2), tail_valid=valid,
                      buf_gamma=buf_gamma)


def select_rows(rows_B: jax.Array, new: jax.Array, old: jax.Array) -> jax.Array:
    """``new`` in the rows ``rows_B`` (bool [B]) of the leading axis, ``old`` elsewhere."""
    return jnp.where(jnp.asarray(rows_B, bool).reshape((-1,) + (1,) * (old.ndim - 1)), new, old)


def reset_rows(state: MemoryState, rows_B: jax.Array) -> MemoryState:
    """``state`` with the memory of the rows ``rows_B`` (bool [B]) back to what a document start
    restores: params to ``reset_to`` (W0, or the state the persistent tokens leave), momentum to
    zero, and the tokens buffered for the current chunk marked padding (``buf_real = False``:
    never written; the Omega window's tail marked out of the document). The conv tail, the chunk phase and the other rows are kept."""
    omega = state.omega
    if omega:   # the Omega window's earlier tokens leave the window too
        omega = omega._replace(tail_valid=select_rows(rows_B, jnp.zeros_like(omega.tail_valid),
                                                      omega.tail_valid))
    return state._replace(
        params=tuple(select_rows(rows_B, r, p) for r, p in zip(state.reset_to, state.params)),
        momentum=tuple(select_rows(rows_B, jnp.zeros_like(m), m) for m in state.momentum),
        buf_real=select_rows(rows_B, jnp.zeros_like(state.buf_real), state.buf_real),
        omega=omega)


__all__ = ["MemoryState", "OmegaState", "Tokens", "next_omega", "empty_state", "next_state", "reset_rows", "select_rows",
           "with_buffer"]
