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


def empty_state(params: tuple, *, chunk_size: int, head_dim: int, inner_dtype,
                conv_tail: tuple = ()) -> MemoryState:
    """The state of a stream that has seen nothing: ``(params, 0)`` at a chunk start, reset to
    ``params``, an empty buffer and the given (zero) conv tail.

    Args:
      params: tuple of [B, H, ...] (W0 broadcast over the batch), inner dtype.
      chunk_size: b. head_dim: Dh. inner_dtype: the dtype of the buffered keys, values, gates.
      conv_tail: () without conv, else the zero (q, k, v) tails [B, K - 1, H, Dh].
    """
    B, H = params[0].shape[:2]
    n = chunk_size - 1
    idt = inner_dtype
    return MemoryState(params=params, momentum=tuple(jnp.zeros_like(p) for p in params),
                       reset_to=params, buf_k=jnp.zeros((B, H, n, head_dim), idt),
                       buf_v=jnp.zeros((B, H, n, head_dim), idt),
                       buf_theta=jnp.zeros((B, H, n), idt), buf_eta=jnp.zeros((B, H, n), idt),
                       buf_log_keep=jnp.zeros((B, H, n), idt), buf_real=jnp.zeros((B, n), bool),
                       buf_reset=jnp.zeros((B, n), bool), n_buf=jnp.zeros((), jnp.int32),
                       conv_tail=tuple(conv_tail))


def with_buffer(state: MemoryState, t: Tokens, n) -> Tokens:
    """[buffer || call] of static length b - 1 + T, the call placed at the dynamic index n."""
    T = t.q.shape[2]
    buf = Tokens(q=jnp.zeros_like(state.buf_k), k=state.buf_k, v=state.buf_v,
                  theta=state.buf_theta, eta=state.buf_eta, log_keep=state.buf_log_keep,
                  real=state.buf_real, reset=state.buf_reset)

    def place(axis):
        def fn(b_, x):
            widths = [(0, 0)] * b_.ndim
            widths[axis] = (0, T)
            return jax.lax.dynamic_update_slice_in_dim(jnp.pad(b_, widths), x.astype(b_.dtype),
                                                       n, axis)
        return fn

    return Tokens(*(place(2 if i < 6 else 1)(bf, x) for i, (bf, x) in enumerate(zip(buf, t))))


def next_state(state: MemoryState, seq: Tokens, P, S, start, prefix, n_next, tail, *,
               inner_dtype) -> MemoryState:
    """Buffer the tokens of seq from ``start`` on (b - 1 slots); a persistent pass makes its
    end state the chunk-start state and the reset target, with an empty buffer."""
    nb = state.buf_real.shape[1]   # b - 1

    def window(x, axis):
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, nb)
        return jax.lax.dynamic_slice_in_dim(jnp.pad(x, widths), start, nb, axis)

    w = Tokens(*(window(x, 2 if i < 6 else 1) for i, x in enumerate(seq)))
    reset_to = tuple(jnp.where(prefix, p, r) for p, r in zip(P, state.reset_to))
    idt = inner_dtype
    return MemoryState(params=tuple(P), momentum=tuple(S), reset_to=reset_to,
                       buf_k=w.k.astype(idt), buf_v=w.v.astype(idt),
                       buf_theta=w.theta.astype(idt), buf_eta=w.eta.astype(idt),
                       buf_log_keep=w.log_keep.astype(idt), buf_real=w.real, buf_reset=w.reset,
                       n_buf=jnp.where(prefix, 0, n_next).astype(jnp.int32),
                       conv_tail=tuple(tail))


def select_rows(rows_B: jax.Array, new: jax.Array, old: jax.Array) -> jax.Array:
    """``new`` in the rows ``rows_B`` (bool [B]) of the leading axis, ``old`` elsewhere."""
    return jnp.where(jnp.asarray(rows_B, bool).reshape((-1,) + (1,) * (old.ndim - 1)), new, old)


def reset_rows(state: MemoryState, rows_B: jax.Array) -> MemoryState:
    """``state`` with the memory of the rows ``rows_B`` (bool [B]) back to what a document start
    restores: params to ``reset_to`` (W0, or the state the persistent tokens leave), momentum to
    zero, and the tokens buffered for the current chunk marked padding (``buf_real = False``:
    never written). The conv tail, the chunk phase and the other rows are kept."""
    return state._replace(
        params=tuple(select_rows(rows_B, r, p) for r, p in zip(state.reset_to, state.params)),
        momentum=tuple(select_rows(rows_B, jnp.zeros_like(m), m) for m in state.momentum),
        buf_real=select_rows(rows_B, jnp.zeros_like(state.buf_real), state.buf_real))


__all__ = ["MemoryState", "Tokens", "empty_state", "next_state", "reset_rows", "select_rows",
           "with_buffer"]
