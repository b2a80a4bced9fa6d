"""Multi-head causal self-attention with RoPE and no biases (Vaswani et al. 2017; RoFormer RoPE),
document-aware, with an optional sliding window, a fully visible persistent-memory prefix and a
bounded KV cache carried between calls.

Protocol (every token mixer): ``state = attn.init_state(B)``;
``y_BTD, state = attn(x_BTD, stream, state)`` with ``stream`` from ``titans_lm.nn.stream``. A call
of T tokens attends over [persistent || cache || new]: query i sees key j iff j is persistent
(segment id ``PERSISTENT_SEGMENT_ID``: visible to every query), or j is in i's run (``doc_ids``),
at or before i, and within the last W tokens including i (i - j < W, stream positions). A
persistent query sees the persistent keys only. W is the sliding window, or ``max_context`` for
full attention (then a call longer than max_context also sees only the last max_context tokens, so
that one call and any split of it agree; with max_context >= T it is plain causal attention).

The state (:class:`AttentionState`) holds the persistent keys/values (``n_persistent`` slots,
written by the persistent prefix's call and never evicted) and the last C = W entries of the
stream (keys after RoPE, values, run ids, stream positions, validity); older entries can never be
seen again. With ``max_context`` None and no window the cache has no slots: one fresh call
(training) is full causal attention, and continuing a stream raises.

The mask is passed to ``jax.nn.dot_product_attention`` (``implementation=None``: XLA today, softmax
in float32; in float64 a plain float64 softmax, see :func:`dot_product_attention`). The sliding window is part of that mask rather than ``local_window_size``, because the
library's window would also hide persistent-memory keys; the mask expresses "same run, causal,
within the window, or persistent" in one place (``attention_mask`` in ``titans_lm.nn.segments`` is
the same rule for one window). Persistent tokens get RoPE position 0, i.e. no rotation.

With a sliding window W, a call of T tokens (T a multiple of W, T >= 2W) whose stream promises
no persistent token inside it (``Stream.no_persistent``, set by the LM shell) runs in bands of W
queries over [persistent slots || 2W keys] (:func:`blocked_window_attention`): O(T W) work and
memory instead of O(T^2), the same result.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from titans_lm.nn.init import normal_param
from titans_lm.nn.project import project
from titans_lm.nn.rope import apply_rope
from titans_lm.nn.segments import PERSISTENT_SEGMENT_ID
from titans_lm.nn.stream import Stream


def dot_product_attention(q_BTHK, k_BSHK, v_BSHK, mask_B1TS) -> jax.Array:
    """softmax(q k^T / sqrt(K) masked) v.

    Shapes: q [B, T, H, K], k and v [B, S, H, K], boolean mask [B, 1, T, S] (True = visible; every
    query row must see at least one key). Returns [B, T, H, K] in the dtype of q. Through
    ``jax.nn.dot_product_attention`` (softmax in float32) except in float64, where the softmax is
    computed in float64 with plain einsums (the library always rounds it to float32), so that
    float64 tests compare implementations to ~1e-12.
    """
    scale = 1.0 / math.sqrt(q_BTHK.shape[-1])
    if q_BTHK.dtype == jnp.float64:
        s_BHTS = jnp.einsum("bthk,bshk->bhts", q_BTHK, k_BSHK) * scale
        p_BHTS = jax.nn.softmax(jnp.where(mask_B1TS, s_BHTS, -jnp.inf), axis=-1)
        return jnp.einsum("bhts,bshk->bthk", p_BHTS, v_BSHK.astype(q_BTHK.dtype))
    return jax.nn.dot_product_attention(q_BTHK, k_BSHK, v_BSHK, mask=mask_B1TS, scale=scale,
                                        implementation=None)


def attention_head_dim(d_model: int, n_heads: int, head_dim: int | None = None) -> int:
    """The per-head width: ``head_dim``, or d_model // n_heads when None.

    Raises:
      ValueError: for n_heads < 1, d_model not divisible by n_heads (when head_dim is None), or a
        head_dim that is odd or < 2 (RoPE rotates pairs of channels).
    """
    if n_heads < 1:
        raise ValueError(f"n_heads must be >= 1, got {n_heads}")
    if head_dim is None:
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        head_dim = d_model // n_heads
    if head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim must be even (RoPE) and >= 2, got {head_dim}")
    return head_dim


def qkvo_params(rngs: nnx.Rngs, d_model: int, n_heads: int, head_dim: int, init_std: float,
                out_init_std: float, param_dtype) -> tuple[nnx.Param, nnx.Param, nnx.Param, nnx.Param]:
    """The projections of multi-head attention, drawn in the order q, k, v, o.

    Returns:
      (w_q, w_k, w_v) [D, H, Dh] with logical axes ("embed", "heads", "head_dim"), N(0, init_std^2);
      w_o [H, Dh, D] ("heads", "head_dim", "embed"), N(0, out_init_std^2); no biases.
    """
    shape_in, axes_in = (d_model, n_heads, head_dim), ("embed", "heads", "head_dim")
    w_q = normal_param(rngs, shape_in, init_std, axes_in, param_dtype)
    w_k = normal_param(rngs, shape_in, init_std, axes_in, param_dtype)
    w_v = normal_param(rngs, shape_in, init_std, axes_in, param_dtype)
    w_o = normal_param(rngs, (n_heads, head_dim, d_model), out_init_std,
                       ("heads", "head_dim", "embed"), param_dtype)
    return w_q, w_k, w_v, w_o


class KVCache(NamedTuple):
    """Keys and values of S stream positions (a pytree).

    k, v: [B, S, H, K] in the compute dtype (keys after RoPE); doc: int32 [B, S] run ids
    (``Stream.doc_ids``; -1 persistent); index: int32 [B, S] stream positions; valid: bool [B, S].
    """

    k: jax.Array
    v: jax.Array
    doc: jax.Array
    index: jax.Array
    valid: jax.Array


class AttentionState(NamedTuple):
    """What attention carries: ``persistent`` (N_p slots, never evicted) and ``recent`` (the last C
    entries of the stream, oldest first; empty slots first while fewer than C were seen)."""

    persistent: KVCache
    recent: KVCache


def empty_cache(batch_size: int, slots: int, n_heads: int, head_dim: int, dtype) -> KVCache:
    """A KVCache of ``slots`` invalid entries."""
    kv = jnp.zeros((batch_size, slots, n_heads, head_dim), dtype)
    ints = jnp.zeros((batch_size, slots), jnp.int32)
    return KVCache(kv, kv, ints, ints, jnp.zeros((batch_size, slots), bool))


def _concat(caches) -> KVCache:
    return KVCache(*(jnp.concatenate(fields, axis=1) for fields in zip(*caches)))


def _select(cache: KVCache, keep_BL: jax.Array, n: int, *, last: bool) -> KVCache:
    """The first (``last``: the last) n entries with ``keep``, in stream order; missing ones are
    invalid slots (after the kept ones for first-n, before them for last-n)."""
    L = keep_BL.shape[1]
    pos_1L = jnp.arange(L, dtype=jnp.int32)[None, :]
    key = jnp.where(keep_BL, pos_1L, -1 if last else L)
    order = jnp.argsort(key, axis=1, stable=True)
    order = order[:, L - n:] if last else order[:, :n]
    take = lambda a: jnp.take_along_axis(  # noqa: E731
        a, order.reshape(order.shape + (1,) * (a.ndim - 2)), axis=1)
    return KVCache(take(cache.k), take(cache.v), take(cache.doc), take(cache.index),
                   take(keep_BL & cache.valid))


def cache_mask(q_doc_BT: jax.Array, q_index_BT: jax.Array, keys: KVCache,
               window: int | None) -> jax.Array:
    """bool [B, 1, T, S]: which of the S keys each of the T queries sees (module docstring rule).

    A query sees its own key (same run, distance 0), so no row is empty when the call's own keys
    are among ``keys``.
    """
    qd, qi = q_doc_BT[:, :, None], q_index_BT[:, :, None]
    kd, ki = keys.doc[:, None, :], keys.index[:, None, :]
    persistent_k = kd == PERSISTENT_SEGMENT_ID
    same = (kd == qd) & (ki <= qi)
    if window is not None:
        same = same & (qi - ki < window)
    mask = keys.valid[:, None, :] & jnp.where(qd == PERSISTENT_SEGMENT_ID, persistent_k,
                                              same | persistent_k)
    return mask[:, None]


def blocked_window_attention(q_BTHK: jax.Array, q_doc_BT: jax.Array, q_index_BT: jax.Array,
                             stream_keys: KVCache, persistent: KVCache | None, window: int
                             ) -> jax.Array:
    """Sliding-window attention in blocks of W queries: O(T W) work and memory, not O(T^2).

    The same result as ``dot_product_attention(q, keys, cache_mask(..., window))`` over
    ``keys = [persistent || stream_keys]``: a query at stream position i sees keys in (i - W, i]
    of its run and the persistent ones, so the W queries of block j need only the keys of blocks
    j - 1 and j of the stream (Longformer-style banded attention; Beltagy et al. 2020). Each block
    attends over [persistent || 2W keys] with the module's mask rule.

    Args:
      q_BTHK: [B, T, H, K] queries of one call, T a multiple of W.
      q_doc_BT, q_index_BT: int32 [B, T] their run ids and stream positions.
      stream_keys: the C + T stream entries before and of the call, oldest first, C in {0, W}:
        the cache (``AttentionState.recent``, the last W entries of the stream) and the call's own.
      persistent: the persistent slots [B, N_p] or None.
      window: W >= 1.
    Returns:
      [B, T, H, K] in the dtype of q.
    Raises:
      ValueError: when T is not a multiple of W or C is neither 0 nor W.
    """
    B, T, H, K = q_BTHK.shape
    W = int(window)
    L = stream_keys.k.shape[1]
    if T % W or L - T not in (0, W):
        raise ValueError(f"blocked window attention needs T % W == 0 and 0 or W cached entries; "
                         f"got T={T}, W={W}, {L - T} cached")
    nb = T // W
    left = W - (L - T)        # invalid slots so that the stream part is [W before || T]

    def blocks(a):            # [B, W + T, ...] -> [B * nb, 2W, ...]: blocks j - 1 and j
        a = jnp.pad(a, [(0, 0), (left, 0)] + [(0, 0)] * (a.ndim - 2))
        a = a.reshape((B, nb + 1, W) + a.shape[2:])
        span = jnp.concatenate([a[:, :-1], a[:, 1:]], axis=2)
        return span.reshape((B * nb, 2 * W) + a.shape[3:])

    keys = KVCache(*(blocks(f) for f in stream_keys))
    if persistent is not None and persistent.k.shape[1]:
        rep = lambda a: jnp.repeat(a, nb, axis=0)  # noqa: E731  row b -> rows b * nb ...
        keys = _concat([KVCache(*(rep(f) for f in persistent)), keys])
    per_block = lambda a: a.reshape((B * nb, W) + a.shape[2:])  # noqa: E731
    mask = cache_mask(per_block(q_doc_BT), per_block(q_index_BT), keys, W)
    o = dot_product_attention(per_block(q_BTHK), keys.k, keys.v, mask)
    return o.reshape(B, T, H, K)


class Attention(nnx.Module):
    """Causal multi-head self-attention token mixer with a carried KV cache.

    ``state = attn.init_state(B)``; ``y_BTD, state = attn(x_BTD, stream, state)``.

    Args:
      d_model: width D of the residual stream.
      n_heads: number of heads H.
      head_dim: size K of a head (default D // H; must then divide evenly).
      rope_theta: RoPE base.
      window: sliding-window size in tokens including the query itself, or None/0 for full causal
        attention. Document-aware: a window never reaches into a previous document.
      max_context: for full attention, the most tokens a query sees (its own included) and the
        size of the KV cache; None/0: unbounded within one call, no cache (a stream cannot be
        continued). Ignored with a window (the cache then holds the window).
      n_persistent: number of persistent positions the LM shell feeds (in ``init_state``); their
        keys/values are kept in their own never-evicted slots.
      dtype: compute dtype (parameters cast to it at use; softmax in float32).
      param_dtype: storage dtype of the parameters.
      init_std: std of the q/k/v projections.
      out_init_std: std of the output projection (default ``init_std``).
      rngs: nnx.Rngs.

    Parameters: ``w_q``, ``w_k``, ``w_v`` [D, H, K] ("embed", "heads", "head_dim") and ``w_o``
    [H, K, D] ("heads", "head_dim", "embed").

    Call: x_BTD [B, T, D]; ``stream`` (``titans_lm.nn.stream.Stream``) of the same [B, T]; RoPE
    positions are ``stream.positions`` (restart at every run start, continue across calls);
    ``state`` an :class:`AttentionState` from ``init_state`` or a previous call. Returns
    (y_BTD in ``dtype``, the new state).

    Raises:
      ValueError: on inconsistent sizes, a negative window or max_context, a call with mismatched
        shapes, or a continued (non-fresh) call of full attention without ``max_context``.
    """

    def __init__(self, d_model: int, n_heads: int, *, head_dim: int | None = None,
                 rope_theta: float = 10000.0, window: int | None = None,
                 max_context: int | None = None, n_persistent: int = 0, dtype=jnp.float32,
                 param_dtype=jnp.float32, init_std: float = 0.02, out_init_std: float | None = None,
                 rngs: nnx.Rngs):
        head_dim = attention_head_dim(d_model, n_heads, head_dim)
        if window is not None and window < 0:
            raise ValueError(f"window must be >= 1 (or 0/None for full attention), got {window}")
        if max_context is not None and max_context < 0:
            raise ValueError(f"max_context must be >= 1 (or 0/None: unbounded), got {max_context}")
        if n_persistent < 0:
            raise ValueError(f"n_persistent must be >= 0, got {n_persistent}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, head_dim
        self.rope_theta = float(rope_theta)
        self.window = window or None
        self.max_context = max_context or None
        self.n_persistent = int(n_persistent)
        self.dtype = dtype
        out_init_std = init_std if out_init_std is None else out_init_std
        self.w_q, self.w_k, self.w_v, self.w_o = qkvo_params(
            rngs, d_model, n_heads, head_dim, init_std, out_init_std, param_dtype)

    @property
    def context(self) -> int | None:
        """W: the most tokens a query sees (window, else max_context; None = unbounded)."""
        return self.window or self.max_context

    @property
    def cache_size(self) -> int:
        """C: slots of the recent-token cache (W; 0 when unbounded)."""
        return self.context or 0

    def init_state(self, batch_size: int) -> AttentionState:
        """Empty persistent slots [B, N_p] and cache [B, C] (see :class:`AttentionState`)."""
        H, K, dt = self.n_heads, self.head_dim, self.dtype
        return AttentionState(empty_cache(batch_size, self.n_persistent, H, K, dt),
                              empty_cache(batch_size, self.cache_size, H, K, dt))

    def reset_memory(self, state: AttentionState, rows_B: jax.Array) -> AttentionState:
        """No neural memory: ``state`` unchanged (mixer protocol, ``titans_lm.models.mixer``)."""
        del rows_B
        return state

    def memory_norms(self, state: AttentionState) -> tuple:
        """No neural memory: ()."""
        del state
        return ()

    def __call__(self, x_BTD: jax.Array, stream: Stream, state: AttentionState
                 ) -> tuple[jax.Array, AttentionState]:
        if x_BTD.ndim != 3 or x_BTD.shape[-1] != self.d_model:
            raise ValueError(f"Attention expects x [B, T, {self.d_model}], got {x_BTD.shape}")
        if stream.segment_ids.shape != x_BTD.shape[:2]:
            raise ValueError(f"stream shape {stream.segment_ids.shape} does not match x "
                             f"{x_BTD.shape[:2]}")
        if not stream.fresh and self.cache_size == 0:
            raise ValueError("full attention without max_context keeps no KV cache, so it cannot "
                             "continue a stream: set max_context (model.max_context, e.g. to "
                             "data.seq_len) to carry state")
        B, T, _ = x_BTD.shape
        dt = self.dtype
        x = x_BTD.astype(dt)
        q = project(x, self.w_q[...].astype(dt))
        k = project(x, self.w_k[...].astype(dt))
        v = project(x, self.w_v[...].astype(dt))
        q = apply_rope(q, stream.positions, self.rope_theta)
        k = apply_rope(k, stream.positions, self.rope_theta)
        index_BT = stream.offset + jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        new = KVCache(k, v, stream.doc_ids, index_BT, jnp.ones((B, T), bool))
        recent = [state.recent] if not stream.fresh and self.cache_size else []
        slots = [state.persistent] if self.n_persistent else []

        if (stream.no_persistent and self.window and T % self.window == 0
                and T >= 2 * self.window):
            # Banded, O(T W) instead of O(T (C + T)). Only when the stream promises no persistent
            # token inside the call: those must stay visible to every query, which bands are not.
            o_BTHK = blocked_window_attention(q, stream.doc_ids, index_BT, _concat(recent + [new]),
                                              slots[0] if slots else None, self.window)
        else:
            keys = _concat(slots + recent + [new])
            mask = cache_mask(stream.doc_ids, index_BT, keys, self.context)
            o_BTHK = dot_product_attention(q, keys.k, keys.v, mask)
        y = project(o_BTHK, self.w_o[...].astype(dt), 2)
        return y, self._update(state, new, stream.fresh)

    def _update(self, state: AttentionState, new: KVCache, fresh: bool) -> AttentionState:
        persistent, recent = state
        if self.n_persistent:
            both = _concat([persistent, new])
            persistent = _select(both, both.valid & (both.doc == PERSISTENT_SEGMENT_ID),
                                 self.n_persistent, last=False)
        if self.cache_size:
            B = new.valid.shape[0]
            old = (empty_cache(B, self.cache_size, self.n_heads, self.head_dim, self.dtype)
                   if fresh else recent)
            both = _concat([old, new])
            recent = _select(both, both.valid & (both.doc != PERSISTENT_SEGMENT_ID),
                             self.cache_size, last=True)
        return AttentionState(persistent, recent)
