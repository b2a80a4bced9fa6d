"""Multi-head causal self-attention with RoPE and no biases (Vaswani et al. 2017; RoFormer RoPE),
document-aware, with an optional sliding window and a fully visible persistent-memory prefix.

The mask is built from the segment ids (``titans_lm.nn.segments.attention_mask``) and passed to
``jax.nn.dot_product_attention`` (``implementation=None``: XLA today, softmax in float32). The
sliding window is part of that mask rather than ``local_window_size``, because the library's
window would also hide persistent-memory keys that lie more than ``window`` tokens back; the mask
expresses "same document, causal, within the window, or persistent" in one place.

Persistent-memory tokens (segment id ``PERSISTENT_SEGMENT_ID``) are visible to every query and see
only each other; they get RoPE position 0, i.e. no rotation (see ``segment_positions``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from titans_lm.nn.init import normal_param
from titans_lm.nn.rope import apply_rope
from titans_lm.nn.segments import attention_mask, document_ids, segment_positions


def dot_product_attention(q_BTHK, k_BSHK, v_BSHK, mask_B1TS) -> jax.Array:
    """softmax(q k^T / sqrt(K) masked) v through ``jax.nn.dot_product_attention``.

    Shapes: q [B, T, H, K], k and v [B, S, H, K], boolean mask [B, 1, T, S] (True = visible; every
    query row must see at least one key). Returns [B, T, H, K] in the dtype of q.
    """
    return jax.nn.dot_product_attention(q_BTHK, k_BSHK, v_BSHK, mask=mask_B1TS,
                                        scale=1.0 / math.sqrt(q_BTHK.shape[-1]), implementation=None)


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


class Attention(nnx.Module):
    """Causal multi-head self-attention token mixer: ``attn(x_BTD, segment_ids_BT) -> y_BTD``.

    Args:
      d_model: width D of the residual stream.
      n_heads: number of heads H.
      head_dim: size K of a head (default D // H; must then divide evenly).
      rope_theta: RoPE base.
      window: sliding-window size in tokens including the query itself, or None/0 for full causal
        attention. Document-aware: a window never reaches into a previous document.
      dtype: compute dtype (parameters cast to it at use; softmax in float32).
      param_dtype: storage dtype of the parameters.
      init_std: std of the q/k/v projections.
      out_init_std: std of the output projection (default ``init_std``).
      rngs: nnx.Rngs.

    Parameters: ``w_q``, ``w_k``, ``w_v`` [D, H, K] ("embed", "heads", "head_dim") and ``w_o``
    [H, K, D] ("heads", "head_dim", "embed").

    The call takes ``segment_ids_BT`` aligned with ``x_BTD`` (ids of prepended persistent tokens are
    ``PERSISTENT_SEGMENT_ID``); RoPE positions restart at 0 at every document start.

    Raises:
      ValueError: on inconsistent sizes, a negative window, or a call with mismatched shapes.
    """

    def __init__(self, d_model: int, n_heads: int, *, head_dim: int | None = None,
                 rope_theta: float = 10000.0, window: int | None = None, dtype=jnp.float32,
                 param_dtype=jnp.float32, init_std: float = 0.02, out_init_std: float | None = None,
                 rngs: nnx.Rngs):
        head_dim = attention_head_dim(d_model, n_heads, head_dim)
        if window is not None and window < 0:
            raise ValueError(f"window must be >= 1 (or 0/None for full attention), got {window}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, head_dim
        self.rope_theta = float(rope_theta)
        self.window = window or None
        self.dtype = dtype
        out_init_std = init_std if out_init_std is None else out_init_std
        self.w_q, self.w_k, self.w_v, self.w_o = qkvo_params(
            rngs, d_model, n_heads, head_dim, init_std, out_init_std, param_dtype)

    def __call__(self, x_BTD: jax.Array, segment_ids_BT: jax.Array) -> jax.Array:
        if x_BTD.ndim != 3 or x_BTD.shape[-1] != self.d_model:
            raise ValueError(f"Attention expects x [B, T, {self.d_model}], got {x_BTD.shape}")
        if segment_ids_BT.shape != x_BTD.shape[:2]:
            raise ValueError(f"segment_ids shape {segment_ids_BT.shape} does not match x "
                             f"{x_BTD.shape[:2]}")
        dt = self.dtype
        x = x_BTD.astype(dt)
        q = jnp.einsum("btd,dhk->bthk", x, self.w_q[...].astype(dt))
        k = jnp.einsum("btd,dhk->bthk", x, self.w_k[...].astype(dt))
        v = jnp.einsum("btd,dhk->bthk", x, self.w_v[...].astype(dt))
        positions_BT = segment_positions(segment_ids_BT)
        q = apply_rope(q, positions_BT, self.rope_theta)
        k = apply_rope(k, positions_BT, self.rope_theta)
        ids_BT = document_ids(segment_ids_BT)
        mask = attention_mask(ids_BT, ids_BT, causal=True, window=self.window)
        o_BTHK = dot_product_attention(q, k, v, mask)
        return jnp.einsum("bthk,hkd->btd", o_BTHK, self.w_o[...].astype(dt))
