"""SwiGLU feed-forward block (Shazeer 2020, "GLU Variants Improve Transformer", eq. 6), no biases:

    SwiGLU(x) = (SiLU(x W_gate) * (x W_up)) W_down,   W_gate, W_up: [d_model, d_ff], W_down: [d_ff, d_model].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from titans_lm.nn.init import normal_param
from titans_lm.nn.project import project


class SwiGLU(nnx.Module):
    """Gated MLP with SiLU.

    Args:
      d_model: input/output width D.
      d_ff: hidden width F.
      dtype: compute dtype (parameters are cast to it at use).
      param_dtype: storage dtype of the parameters.
      init_std: std of W_gate and W_up (normal init).
      out_init_std: std of W_down (default ``init_std``; models pass the depth-scaled value).
      rngs: nnx.Rngs.

    Parameters: ``w_gate``, ``w_up`` [D, F] ("embed", "mlp"); ``w_down`` [F, D] ("mlp", "embed").
    Call: ``mlp(x_BTD) -> y_BTD`` in ``dtype``.
    """

    def __init__(self, d_model: int, d_ff: int, *, dtype=jnp.float32, param_dtype=jnp.float32,
                 init_std: float = 0.02, out_init_std: float | None = None, rngs: nnx.Rngs):
        if d_model < 1 or d_ff < 1:
            raise ValueError(f"d_model and d_ff must be >= 1, got {d_model}, {d_ff}")
        out_init_std = init_std if out_init_std is None else out_init_std
        self.dtype = dtype
        self.w_gate = normal_param(rngs, (d_model, d_ff), init_std, ("embed", "mlp"), param_dtype)
        self.w_up = normal_param(rngs, (d_model, d_ff), init_std, ("embed", "mlp"), param_dtype)
        self.w_down = normal_param(rngs, (d_ff, d_model), out_init_std, ("mlp", "embed"), param_dtype)

    def __call__(self, x_BTD: jax.Array) -> jax.Array:
        dt = self.dtype
        x = x_BTD.astype(dt)
        gate = project(x, self.w_gate[...].astype(dt))
        up = project(x, self.w_up[...].astype(dt))
        return project(jax.nn.silu(gate) * up, self.w_down[...].astype(dt))
