"""How a hybrid merges its attention branch and its memory branch (Titans MAG/MAC's ⊗).

Titans (Behrouz et al. 2025, arXiv:2501.00663, section 4.2, eq. 28 and the text after it) combines
the sliding-window attention output y and the memory output m as o = y ⊗ M(x~), where "we normalize
the outputs y and M(x~) using learnable vector-valued weights, followed by a non-linearity σ(.)",
and section 4.4 puts "normalization and gating with a linear layer before the final output
projection". Here:

    o = (RMSNorm_y(y) * sigmoid(RMSNorm_m(m))) W_O

with separate learned RMSNorm scales for the two branches (the vector-valued weights), σ the
logistic sigmoid (so the memory decides, per channel, how much of the attention output passes), and
a bias-free output projection W_O [D, D]. MAC's o = y ⊗ M*(y) (eq. 25) uses the same gate.

``model.combine`` chooses between it ("gate", the paper's; what an absent field means) and
:class:`SumCombine` ("sum": o = y + m, each branch through its own output projection, as LaCT's
block adds window attention and the TTT layer; a deviation from Titans, docs/design.md).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from titans_lm.nn.dtypes import to_dtype
from titans_lm.nn.init import normal_param
from titans_lm.nn.norm import RMSNorm
from titans_lm.nn.project import project


class GatedCombine(nnx.Module):
    """``combine(y_BTD, m_BTD) -> o_BTD``: o = (RMSNorm_y(y) * sigmoid(RMSNorm_m(m))) W_O.

    Args:
      d_model: D.
      norm_eps: RMSNorm epsilon.
      dtype: compute dtype; param_dtype: storage dtype.
      out_init_std: std of W_O (the LM passes the depth-scaled residual init).
      rngs: nnx.Rngs.

    Parameters: ``norm_y``, ``norm_m`` (RMSNorm scales [D], "embed") and ``w_o`` [D, D]
    (None, "embed").

    Raises:
      ValueError: if y and m differ in shape or their last axis is not D.
    """

    def __init__(self, d_model: int, *, norm_eps: float = 1e-6, dtype=jnp.float32,
                 param_dtype=jnp.float32, out_init_std: float = 0.02, rngs: nnx.Rngs):
        self.d_model, self.dtype = d_model, dtype
        self.norm_y = RMSNorm(d_model, eps=norm_eps, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.norm_m = RMSNorm(d_model, eps=norm_eps, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.w_o = normal_param(rngs, (d_model, d_model), out_init_std, (None, "embed"), param_dtype)

    def __call__(self, y_BTD: jax.Array, m_BTD: jax.Array) -> jax.Array:
        if y_BTD.shape != m_BTD.shape or y_BTD.shape[-1] != self.d_model:
            raise ValueError(f"GatedCombine wants y and m of one shape [..., {self.d_model}], got "
                             f"{y_BTD.shape} and {m_BTD.shape}")
        dt = self.dtype
        gated = self.norm_y(y_BTD.astype(dt)) * jax.nn.sigmoid(self.norm_m(m_BTD.astype(dt)))
        return project(gated, self.w_o[...].astype(dt))


COMBINES = ("gate", "sum")


class SumCombine(nnx.Module):
    """``combine(y_BTD, m_BTD) -> y + m``: the branches added, no parameters (LaCT's block).

    Raises:
      ValueError: if y and m differ in shape.
    """

    def __call__(self, y_BTD: jax.Array, m_BTD: jax.Array) -> jax.Array:
        if y_BTD.shape != m_BTD.shape:
            raise ValueError(f"SumCombine wants y and m of one shape, got {y_BTD.shape} and "
                             f"{m_BTD.shape}")
        return y_BTD + m_BTD.astype(y_BTD.dtype)


def make_combine(model_cfg, out_init_std: float, *, rngs: nnx.Rngs) -> GatedCombine | SumCombine:
    """The ``model.combine`` of a MAG or MAC layer: ``GatedCombine`` (its W_O drawn with
    ``out_init_std``) or ``SumCombine``.

    Raises:
      ValueError: for a ``combine`` other than "gate" or "sum".
    """
    if combine_mode(model_cfg) == "sum":
        return SumCombine()
    return GatedCombine(model_cfg.d_model, norm_eps=model_cfg.norm_eps,
                        dtype=to_dtype(model_cfg.dtype),
                        param_dtype=to_dtype(model_cfg.get("param_dtype", "float32")),
                        out_init_std=out_init_std, rngs=rngs)


def branch_out_stds(model_cfg, out_init_std: float) -> tuple[float, float | None]:
    """Init stds of the attention's and the memory's output projections, (attention, memory):
    with the sum both feed the residual stream and take the depth-scaled ``out_init_std``; with
    the gate, only the gate's W_O does (attention: ``init_std``; memory: None, its default)."""
    if combine_mode(model_cfg) == "sum":
        return out_init_std, out_init_std
    return model_cfg.init_std, None


def combine_mode(model_cfg) -> str:
    """The ``combine`` field of a MAG or MAC model config ("gate" where absent).

    Raises:
      ValueError: for a value other than "gate" or "sum".
    """
    combine = str(model_cfg.get("combine", "gate"))
    if combine not in COMBINES:
        raise ValueError(f"model.combine must be one of {COMBINES}, got {combine!r}")
    return combine
