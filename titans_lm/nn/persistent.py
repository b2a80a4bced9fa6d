"""Persistent memory (Titans, Behrouz et al. 2025, section 3.3, eq. 19): N_p learned,
input-independent vectors placed before the sequence, x~ = [p_1 .. p_Np || x].

The LM shell feeds them once, as the first call of every stream (``LanguageModel.init_state``),
with segment id ``PERSISTENT_SEGMENT_ID``: attention keeps their keys/values in never-evicted
slots (every token sees them; they see only each other) and gives them RoPE position 0; a memory
writes them first and restarts every document from the state they leave. They produce no logits,
so nothing has to be stripped from the outputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from titans_lm.nn.init import normal_param
from titans_lm.nn.segments import PERSISTENT_SEGMENT_ID


class PersistentMemory(nnx.Module):
    """``mem(batch_size, dtype) -> (p_BPD, segment_ids_BP)``: the prefix for every row.

    Args:
      n_persistent: N_p >= 1.
      d_model: D.
      init_std: std of the normal init.
      param_dtype: storage dtype.
      rngs: nnx.Rngs.

    Parameter ``tokens`` [N_p, D] (None, "embed"). Returns the tokens cast to ``dtype`` and
    broadcast to [B, N_p, D], and int32 ids [B, N_p] all ``PERSISTENT_SEGMENT_ID``.
    """

    def __init__(self, n_persistent: int, d_model: int, *, init_std: float = 0.02,
                 param_dtype=jnp.float32, rngs: nnx.Rngs):
        if n_persistent < 1:
            raise ValueError(f"n_persistent must be >= 1, got {n_persistent}")
        self.n_persistent = n_persistent
        self.tokens = normal_param(rngs, (n_persistent, d_model), init_std, (None, "embed"),
                                   param_dtype)

    def __call__(self, batch_size: int, dtype) -> tuple[jax.Array, jax.Array]:
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        shape = (int(batch_size),) + self.tokens.shape
        return (jnp.broadcast_to(self.tokens[...].astype(dtype), shape),
                jnp.full(shape[:2], PERSISTENT_SEGMENT_ID, jnp.int32))
