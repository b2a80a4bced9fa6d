"""Weight normalisation of the fast weights (LaCT, Zhang et al. 2025, arXiv:2505.23884).

LaCT keeps no forget gate: after each mini-batch's update it rescales every fast-weight matrix
so that each output unit's weight vector (over the input dimension) keeps the norm it had in the
initial state. With row vectors (``h @ W``, W [d_in, d_out]; :mod:`titans_lm.memory.inner_models`)
an output unit is a column of W, so

    W <- W * (||W0[:, j]|| / ||W[:, j]||)   for every column j,

W0 the state the document started from (the engine's ``reset_to``). Vectors (biases, LayerNorm
scale and shift) are left as they are, and so are outer-loop parameters (never written).
Where the normalisation happens in the recurrence (mini-batch ends) is the engines' part:
docs/design.md#lact-large-chunks.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp


def column_norms(w: jax.Array) -> jax.Array:
    """[d_out] Euclidean norms of the columns of a matrix w [d_in, d_out] (over the input dim).

    A zero column has norm 0 with a zero (not NaN) derivative."""
    sq = jnp.sum(w * w, axis=0)
    positive = sq > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, sq, 1)), 0)


def normalize_fast_weights(params: Sequence[jax.Array], target: Sequence[jax.Array],
                           outer: frozenset = frozenset()) -> tuple[jax.Array, ...]:
    """``params`` with every weight matrix rescaled column by column to ``target``'s column norms.

    Args:
      params: one head's parameter tuple of the inner model (matrices [d_in, d_out], vectors [d]).
      target: a tuple of the same structure whose column norms the matrices get (W0).
      outer: indices of outer-loop parameters, returned unchanged.
    Returns:
      the tuple: matrices W[:, j] * (||target[:, j]|| / ||W[:, j]||) (a zero column stays zero),
      vectors and ``outer`` entries unchanged.
    """
    out = []
    for i, (p, t) in enumerate(zip(params, target)):
        if i in outer or p.ndim != 2:
            out.append(p)
            continue
        norm = column_norms(p)
        scale = column_norms(t) / jnp.where(norm > 0, norm, 1)
        out.append(p * scale[None, :])
    return tuple(out)
