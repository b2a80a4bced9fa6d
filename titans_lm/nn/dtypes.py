"""Dtype names used in model configs, resolved to numpy dtypes; casting a tree's floats."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float64": jnp.float64}


def to_dtype(name) -> jnp.dtype:
    """Resolve "float32" | "bfloat16" | "float64" (or a dtype) to a numpy dtype.

    float64 is meant for numerical tests under ``jax.enable_x64(True)``.

    Raises:
      ValueError: for any other name.
    """
    if not isinstance(name, str):
        return jnp.dtype(name)
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(_DTYPES)}")
    return jnp.dtype(_DTYPES[name])


def logits_dtype(compute_dtype) -> jnp.dtype:
    """float32, or float64 when the compute dtype is float64 (softmax/norm statistics dtype too)."""
    return jnp.promote_types(jnp.dtype(compute_dtype), jnp.float32)


def cast_floats(tree: Any, dtype: jnp.dtype) -> Any:
    """``tree`` with its floating-point leaves cast to ``dtype`` (integer leaves unchanged)."""
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x,
                        tree)
