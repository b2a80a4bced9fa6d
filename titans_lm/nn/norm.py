"""RMSNorm (Zhang & Sennrich 2019): y = x / sqrt(mean(x^2) + eps) * scale.

``nnx.RMSNorm`` with the scale named on a logical axis; its statistics are always computed in at
least float32 (flax ``_compute_stats``), and its output is in the compute dtype.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from titans_lm.nn.init import check_axes


class RMSNorm(nnx.RMSNorm):
    """RMS normalisation over the last axis.

    Args:
      d: feature size (last axis of the input).
      eps: added to the mean square before the reciprocal square root.
      dtype: compute/output dtype (statistics stay >= float32).
      param_dtype: dtype of the scale (initialised to ones).
      axis: logical axis name of the scale ("embed" for the residual stream; "head_dim" or None for
        per-head norms).
      rngs: nnx.Rngs.

    Call: ``norm(x_...D) -> y_...D`` in ``dtype``.
    """

    def __init__(self, d: int, *, eps: float = 1e-6, dtype=jnp.float32, param_dtype=jnp.float32,
                 axis: str | None = "embed", rngs: nnx.Rngs):
        check_axes((d,), (axis,))
        super().__init__(d, epsilon=eps, dtype=dtype, param_dtype=param_dtype,
                         scale_init=nnx.with_partitioning(nnx.initializers.ones, (axis,)),
                         use_fast_variance=False, rngs=rngs)
