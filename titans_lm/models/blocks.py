"""Pre-norm residual block shared by every backbone (Transformer++, as in the TTT and Titans papers'
baselines):

    x <- x + mixer(RMSNorm(x), stream, state)
    x <- x + SwiGLU(RMSNorm(x))

The token mixer is any module with the mixer protocol (attention, a test-time-learning memory, a
hybrid; ``titans_lm.models.mixer.Mixer``): ``mixer.init_state(B) -> state`` and
``mixer(x_BTD, stream, state) -> (y_BTD, state)`` (``stream`` from ``titans_lm.nn.stream``), plus
``reset_memory`` and ``memory_norms``, so a backbone is a choice of mixer per block.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from titans_lm.nn.mlp import SwiGLU
from titans_lm.nn.norm import RMSNorm
from titans_lm.nn.stream import Stream


class Block(nnx.Module):
    """Pre-norm block: ``block.init_state(B)``; ``block(x_BTD, stream, state) -> (x_BTD, state)``.

    Args:
      mixer: token mixer module with the mixer protocol (module docstring).
      d_model: D; d_ff: SwiGLU hidden width.
      norm_eps: RMSNorm epsilon.
      dtype: compute dtype; param_dtype: parameter storage dtype.
      init_std: std of the MLP input projections; out_init_std: std of its output projection.
      rngs: nnx.Rngs.

    Submodules: ``mixer_norm``, ``mixer``, ``mlp_norm``, ``mlp``. The block's state is its
    mixer's (the MLP is per token).
    """

    def __init__(self, mixer: nnx.Module, *, d_model: int, d_ff: int, norm_eps: float = 1e-6,
                 dtype=jnp.float32, param_dtype=jnp.float32, init_std: float = 0.02,
                 out_init_std: float | None = None, rngs: nnx.Rngs):
        self.mixer_norm = RMSNorm(d_model, eps=norm_eps, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.mixer = mixer
        self.mlp_norm = RMSNorm(d_model, eps=norm_eps, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.mlp = SwiGLU(d_model, d_ff, dtype=dtype, param_dtype=param_dtype, init_std=init_std,
                          out_init_std=out_init_std, rngs=rngs)

    def init_state(self, batch_size: int):
        """The mixer's fresh state."""
        return self.mixer.init_state(batch_size)

    def __call__(self, x_BTD: jax.Array, stream: Stream, state) -> tuple[jax.Array, object]:
        y_BTD, state = self.mixer(self.mixer_norm(x_BTD), stream, state)
        x_BTD = x_BTD + y_BTD.astype(x_BTD.dtype)
        return x_BTD + self.mlp(self.mlp_norm(x_BTD)).astype(x_BTD.dtype), state
