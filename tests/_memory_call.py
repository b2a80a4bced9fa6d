"""The NeuralMemory layer called as one whole sequence from its initial state (the training
path of the mixer protocol), for tests that look at one call."""

from __future__ import annotations

import jax.numpy as jnp

from titans_lm.nn.stream import fresh_stream_state, make_stream


def call_fresh(layer, x_BTD, segment_ids_BT=None):
    """``layer(x, stream, layer.init_state(B))[0]`` for a fresh stream (one document if no ids)."""
    B, T = x_BTD.shape[:2]
    ids = jnp.ones((B, T), jnp.int32) if segment_ids_BT is None else jnp.asarray(segment_ids_BT)
    stream, _ = make_stream(ids, fresh_stream_state(B), fresh=True)
    return layer(x_BTD, stream, layer.init_state(B))[0]
