"""Attention of a segment's tokens over [persistent || retrieved memory || segment] (Titans MAC).

Memory as a Context (Behrouz et al. 2025, arXiv:2501.00663, section 4.1, eqs. 21-23): the tokens of
a segment S (length N) attend over the concatenation

    S~ = [p_1 .. p_Np  ||  h_1 .. h_N  ||  x_1 .. x_N]

of N_p learned persistent tokens, the N tokens h_j = M*(q_j) retrieved from the long-term memory
for the segment's tokens, and the segment's own tokens. The mask (:func:`context_mask`): query i
sees every persistent token, and h_j and x_j only for j <= i inside i's own document. h_j is
aligned with x_j: it gets x_j's RoPE position and document; persistent tokens get position 0 (no
rotation, as in ``titans_lm.nn.segments``). Only the segment's tokens are queries (the outputs at
the persistent and memory positions are never used downstream), so the call returns [B, N, D].

Without ``h`` this is block-local causal attention over [persistent || segment]; applied to a whole
sequence reshaped into rows of segments it is MAC's attention without a memory.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from titans_lm.nn.attention import attention_head_dim, dot_product_attention, qkvo_params
from titans_lm.nn.init import normal_param
from titans_lm.nn.project import project
from titans_lm.nn.rope import apply_rope


def context_mask(doc_BN: jax.Array, n_prefix: int, n_aligned: int) -> jax.Array:
    """Mask of N queries over [prefix (n_prefix) || n_aligned blocks of N keys aligned with them].

    Args:
      doc_BN: int [B, N] document id of every query (and of the aligned keys at the same index);
        pass canonical ids (``titans_lm.nn.segments.document_ids``) so that two runs of a reused
        id stay apart.
      n_prefix: number of fully visible prefix keys (persistent tokens), >= 0.
      n_aligned: number of aligned key blocks (1: the segment; 2: retrieved memory and segment).

    Returns:
      bool [B, 1, N, n_prefix + n_aligned * N]: prefix keys always visible; aligned key j of any
      block visible iff j <= i and doc[j] == doc[i]. Every query sees at least its own token.

    Raises:
      ValueError: on a non-2-D id array or negative sizes.
    """
    if doc_BN.ndim != 2:
        raise ValueError(f"doc_BN must be [B, N], got shape {doc_BN.shape}")
    if n_prefix < 0 or n_aligned < 1:
        raise ValueError(f"need n_prefix >= 0 and n_aligned >= 1, got {n_prefix}, {n_aligned}")
    B, N = doc_BN.shape
    i_N1 = jnp.arange(N)[:, None]
    j_1N = jnp.arange(N)[None, :]
    block_BNN = (doc_BN[:, :, None] == doc_BN[:, None, :]) & (j_1N <= i_N1)[None]
    prefix_BNP = jnp.ones((B, N, n_prefix), bool)
    mask = jnp.concatenate([prefix_BNP] + [block_BNN] * n_aligned, axis=2)
    return mask[:, None]


class ContextAttention(nnx.Module):
    """MAC's segment attention: ``attn(x_BND, doc_BN, pos_BN, h_BND=None) -> y_BND``.

    Args:
      d_model: width D of the tokens (x, h and the persistent tokens).
      n_heads: number of heads H.
      head_dim: size K of a head (default D // H).
      n_persistent: number N_p >= 0 of learned persistent tokens (section 3.3), a parameter of this
        layer, prepended to every segment as keys and values.
      rope_theta: RoPE base.
      dtype: compute dtype (softmax in float32 or wider); param_dtype: storage dtype.
      init_std: std of the q/k/v projections and of the persistent tokens.
      out_init_std: std of the output projection (default ``init_std``).
      rngs: nnx.Rngs.

    Parameters: ``w_q``, ``w_k``, ``w_v`` [D, H, K] ("embed", "heads", "head_dim"), ``w_o``
    [H, K, D] ("heads", "head_dim", "embed") and, when N_p > 0, ``persistent`` [N_p, D]
    (None, "embed").

    Call:
      x_BND: [B, N, D] the segment's tokens (the queries).
      doc_BN: int [B, N] canonical document ids of the tokens.
      pos_BN: int [B, N] RoPE positions (position inside the document).
      h_BND: optional [B, N, D] retrieved memory tokens aligned with x (h_j belongs to token j).
    Returns [B, N, D] in ``dtype``.

    Raises:
      ValueError: on inconsistent sizes or ill-shaped inputs.
    """

    def __init__(self, d_model: int, n_heads: int, *, head_dim: int | None = None,
                 n_persistent: int = 0, rope_theta: float = 10000.0, dtype=jnp.float32,
                 param_dtype=jnp.float32, init_std: float = 0.02, out_init_std: float | None = None,
                 rngs: nnx.Rngs):
        head_dim = attention_head_dim(d_model, n_heads, head_dim)
        if n_persistent < 0:
            raise ValueError(f"n_persistent must be >= 0, got {n_persistent}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, head_dim
        self.n_persistent, self.rope_theta, self.dtype = n_persistent, float(rope_theta), dtype
        out_init_std = init_std if out_init_std is None else out_init_std
        self.w_q, self.w_k, self.w_v, self.w_o = qkvo_params(
            rngs, d_model, n_heads, head_dim, init_std, out_init_std, param_dtype)
        self.persistent = (normal_param(rngs, (n_persistent, d_model), init_std, (None, "embed"),
                                        param_dtype) if n_persistent else None)

    def __call__(self, x_BND: jax.Array, doc_BN: jax.Array, pos_BN: jax.Array,
                 h_BND: jax.Array | None = None) -> jax.Array:
        if x_BND.ndim != 3 or x_BND.shape[-1] != self.d_model:
            raise ValueError(f"ContextAttention expects x [B, N, {self.d_model}], got {x_BND.shape}")
        B, N, _ = x_BND.shape
        if doc_BN.shape != (B, N) or pos_BN.shape != (B, N):
            raise ValueError(f"doc and pos must be [B, N] = {(B, N)}, got {doc_BN.shape} and "
                             f"{pos_BN.shape}")
        if h_BND is not None and h_BND.shape != x_BND.shape:
            raise ValueError(f"h must have the shape of x {x_BND.shape}, got {h_BND.shape}")
        dt = self.dtype
        wq, wk, wv = (w[...].astype(dt) for w in (self.w_q, self.w_k, self.w_v))
        x = x_BND.astype(dt)
        q = apply_rope(project(x, wq), pos_BN, self.rope_theta)
        keys, values = [], []
        if self.n_persistent:
            p_PD = self.persistent[...].astype(dt)
            k_p = project(p_PD, wk)  # position 0: no rotation
            v_p = project(p_PD, wv)
            keys.append(jnp.broadcast_to(k_p, (B,) + k_p.shape))
            values.append(jnp.broadcast_to(v_p, (B,) + v_p.shape))
        aligned = [x] if h_BND is None else [h_BND.astype(dt), x]
        for a in aligned:
            keys.append(apply_rope(project(a, wk), pos_BN, self.rope_theta))
            values.append(project(a, wv))
        k = jnp.concatenate(keys, axis=1)
        v = jnp.concatenate(values, axis=1)
        mask = context_mask(doc_BN, self.n_persistent, len(aligned))
        o_BNHK = dot_product_attention(q, k, v, mask)
        return project(o_BNHK, self.w_o[...].astype(dt), 2)
