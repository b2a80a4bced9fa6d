"""Persistent memory (Titans, Behrouz et al. 2025, section 3.3, eq. 19): N_p learned,
input-independent vectors prepended to the sequence, x~ = [p_1 .. p_Np || x].

Their positions get segment id ``PERSISTENT_SEGMENT_ID``, which the attention mask treats as a
fully visible prefix (every token sees them; they see only each other) and which gives them RoPE
position 0. Short convolutions and document resets treat the first real token as a document start,
so a document's outputs do not depend on where it sits in the window. Outputs at persistent
positions carry no loss: strip them with :func:`strip_persistent`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from titans_lm.nn.init import normal_param
from titans_lm.nn.segments import PERSISTENT_SEGMENT_ID


class PersistentMemory(nnx.Module):
    """``mem(x_BTD, segment_ids_BT) -> (x_BSD, segment_ids_BS)`` with S = N_p + T.

    Args:
      n_persistent: N_p >= 1.
      d_model: D.
      init_std: std of the normal init.
      param_dtype: storage dtype.
      rngs: nnx.Rngs.

    Parameter ``tokens`` [N_p, D] (None, "embed"). The prefix is cast to the dtype of ``x``.
    """

    def __init__(self, n_persistent: int, d_model: int, *, init_std: float = 0.02,
                 param_dtype=jnp.float32, rngs: nnx.Rngs):
        if n_persistent < 1:
            raise ValueError(f"n_persistent must be >= 1, got {n_persistent}")
        self.n_persistent = n_persistent
        self.tokens = normal_param(rngs, (n_persistent, d_model), init_std, (None, "embed"),
                                   param_dtype)

    def __call__(self, x_BTD: jax.Array, segment_ids_BT: jax.Array):
        B, T, D = x_BTD.shape
        if segment_ids_BT.shape != (B, T):
            raise ValueError(f"segment_ids shape {segment_ids_BT.shape} does not match x {(B, T)}")
        prefix_BPD = jnp.broadcast_to(self.tokens[...].astype(x_BTD.dtype), (B, self.n_persistent, D))
        ids_BP = jnp.full((B, self.n_persistent), PERSISTENT_SEGMENT_ID, segment_ids_BT.dtype)
        return (jnp.concatenate([prefix_BPD, x_BTD], axis=1),
                jnp.concatenate([ids_BP, segment_ids_BT], axis=1))


def strip_persistent(y_BSD: jax.Array, n_persistent: int) -> jax.Array:
    """Drop the first ``n_persistent`` positions along axis 1: [B, N_p + T, ...] -> [B, T, ...]."""
    if n_persistent < 0 or n_persistent > y_BSD.shape[1]:
        raise ValueError(f"cannot strip {n_persistent} persistent positions from length {y_BSD.shape[1]}")
    return y_BSD[:, n_persistent:]
