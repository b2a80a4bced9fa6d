"""Memory-state statistics for the trainer's metrics, computed from the state a call returns.

The norm of a neural memory's state relative to its layer's learned initial state W0:

    memory_norm = max over batch and heads of ||P||_F / ||W0||_F

(all inner parameters together; 1 means the memory is where it started in scale; a memory that
starts from zero, ``learned_w0=False``, reports ||P||_F itself). A memory whose
inner loop diverges shows it here first (tens, then inf/NaN), while an outer-optimiser blow-up
leaves it near 1 until the parameters themselves go bad.

``P`` is the memory a mixer's state holds after the call (``mixer.memory_norms(state)``, see
``titans_lm.models.mixer``): for a NeuralMemory the state at the last chunk start (the end of
the sequence when the chunk size divides it), for MAC the state at the current segment's start.
``LanguageModel.memory_norms(state)`` gives one value per memory layer in block order; the train
step reports them as ``memory_norm_i`` (:func:`as_metrics`). Computing them from the returned
state works under every transformation (remat, MAC's segment scan) and costs one reduction per
layer; it never changes the model's result.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp


def memory_norm(params: Sequence[jax.Array], w0: Sequence[jax.Array]) -> jax.Array:
    """``max_{b,h} ||P||_F / ||W0||_F`` as a float32 scalar (no gradient).

    Args:
      params: the memory's inner parameters, tuple of [B, H, ...].
      w0: the layer's initial parameters, tuple of [H, ...].
    """
    sq = sum(jnp.sum(jnp.square(p.astype(jnp.float32)), axis=tuple(range(2, p.ndim)))
             for p in params)
    sq0 = sum(jnp.sum(jnp.square(w.astype(jnp.float32)), axis=tuple(range(1, w.ndim))) for w in w0)
    sq0 = jnp.where(sq0 > 0, sq0, 1.0)[None, :]   # a zero W0 (learned_w0 False): ||P|| itself
    ratio = jnp.sqrt(sq) / jnp.sqrt(sq0)
    return jax.lax.stop_gradient(jnp.max(ratio)).astype(jnp.float32)


def as_metrics(norms: Sequence[jax.Array], prefix: str = "memory_norm") -> dict[str, jax.Array]:
    """``{"memory_norm_0": ..., "memory_norm_1": ...}`` of the norms in layer order."""
    return {f"{prefix}_{i}": jnp.asarray(v, jnp.float32) for i, v in enumerate(norms)}


__all__ = ["as_metrics", "memory_norm"]
