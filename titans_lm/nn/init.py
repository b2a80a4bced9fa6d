"""Parameter creation with logical axis names (the sharding table: ``titans_lm.nn.axes``)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax.numpy as jnp
from flax import nnx

from titans_lm.nn.axes import AXIS_NAMES


def normal_param(rngs: nnx.Rngs, shape: Sequence[int], std: float,
                 axes: Sequence[str | None], param_dtype=jnp.float32) -> nnx.Param:
    """An ``nnx.Param`` drawn from N(0, std^2) that carries logical axis names.

    Args:
      rngs: source of the ``params`` key.
      shape: parameter shape.
      std: standard deviation (>= 0).
      axes: one logical name (from :data:`AXIS_NAMES`) or None per dimension.
      param_dtype: storage dtype.

    Raises:
      ValueError: if ``axes`` does not match ``shape`` or names an unknown axis.
    """
    check_axes(shape, axes)
    init = nnx.with_partitioning(nnx.initializers.normal(std), tuple(axes))
    return nnx.Param(init(rngs.params(), tuple(shape), param_dtype))


def check_axes(shape: Sequence[int], axes: Sequence[str | None]) -> None:
    """Raise ValueError unless ``axes`` has one known logical name (or None) per dimension."""
    if len(axes) != len(shape):
        raise ValueError(f"axis names {tuple(axes)} do not match parameter shape {tuple(shape)}")
    bad = [a for a in axes if a is not None and a not in AXIS_NAMES]
    if bad:
        raise ValueError(f"unknown logical axis names {bad}; allowed: {sorted(AXIS_NAMES)} or None")


def scaled_out_std(init_std: float, n_layers: int) -> float:
    """Init std of residual-branch output projections: init_std / sqrt(2 * n_layers).

    GPT-2 (Radford et al. 2019, section 2.3) scales the weights of residual layers by 1/sqrt(N),
    N the number of residual branches (two per block), so the residual stream's variance at
    initialisation does not grow with depth.
    """
    if n_layers < 1:
        raise ValueError(f"n_layers must be >= 1, got {n_layers}")
    return init_std / math.sqrt(2 * n_layers)
