"""Memory-state statistics gathered while a model runs (for the trainer's metrics).

Inside ``with collect() as stats:`` every :meth:`NeuralMemory.scan` records the norm of the
memory state it ends with, relative to the layer's learned initial state W0:

    memory_norm = max over batch and heads of ||P_T||_F / ||W0||_F

(all inner parameters together; 1 means the memory ended where it started in scale). A memory
whose inner loop diverges shows it here first (tens, then inf/NaN), while an outer-optimiser
blow-up leaves it near 1 until the parameters themselves go bad. ``stats.values()`` gives one
value per memory layer, in call order (the last scan of each layer counts: for a layer with
persistent tokens, the scan over the sequence after the prefix).

Recording happens at trace time and costs one reduction per layer. A scan traced inside another
transformation (``lax.scan`` over MAC segments, ``jax.checkpoint`` of remat'ed blocks) cannot hand
its value out; those records are dropped and ``values()`` leaves them out (recording never
changes the model's result). Outside ``collect()`` nothing is recorded.
"""

from __future__ import annotations

import contextlib
import threading

import jax
import jax.numpy as jnp
from jax._src import core as _core  # the current trace: records from nested traces are skipped

_active = threading.local()


def _current_trace():
    return _core.trace_ctx.trace


class MemoryStats:
    """The records of one :func:`collect` block."""

    def __init__(self):
        self._by_layer: dict[int, jax.Array] = {}
        self._order: list[int] = []
        self.trace = _current_trace()

    def add(self, key: int, value: jax.Array) -> None:
        if key not in self._by_layer:
            self._order.append(key)
        self._by_layer[key] = value

    def values(self) -> list[jax.Array]:
        """float32 scalars, one per memory layer that could be recorded, in call order."""
        return [jnp.asarray(self._by_layer[key], jnp.float32) for key in self._order]

    def as_metrics(self, prefix: str = "memory_norm") -> dict[str, jax.Array]:
        """``{"memory_norm_0": ..., "memory_norm_1": ...}``."""
        return {f"{prefix}_{i}": v for i, v in enumerate(self.values())}


@contextlib.contextmanager
def collect():
    """Record memory-state norms of the scans traced inside the block (see the module doc)."""
    previous = getattr(_active, "stats", None)
    stats = MemoryStats()
    _active.stats = stats
    try:
        yield stats
    finally:
        _active.stats = previous


def record_state(layer, params_final: tuple, w0: tuple) -> None:
    """Record ``max_{b,h} ||P_T||_F / ||W0||_F`` for ``layer`` (``params_final``: tuple of
    [B, H, ...]; ``w0``: tuple of [H, ...]) when a :func:`collect` block is active."""
    stats = getattr(_active, "stats", None)
    if stats is None or _current_trace() is not stats.trace:
        return  # not collecting, or inside a nested transformation (its values cannot get out)
    sq = sum(jnp.sum(jnp.square(p.astype(jnp.float32)), axis=tuple(range(2, p.ndim)))
             for p in params_final)
    sq0 = sum(jnp.sum(jnp.square(w.astype(jnp.float32)), axis=tuple(range(1, w.ndim))) for w in w0)
    ratio = jnp.sqrt(sq) / jnp.sqrt(jnp.maximum(sq0, 1e-30))[None, :]
    stats.add(id(layer), jax.lax.stop_gradient(jnp.max(ratio)))


__all__ = ["MemoryStats", "collect", "record_state"]
