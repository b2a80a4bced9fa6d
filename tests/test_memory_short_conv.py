"""Causal depthwise short convolution with document resets."""

import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.memory.documents import document_index
from titans_lm.memory.short_conv import causal_depthwise_conv


def _loop(x, w, doc):
    B, T, C = x.shape
    K = w.shape[0]
    y = np.zeros_like(x)
    for b in range(B):
        for t in range(T):
            for j in range(K):
                if t - j >= 0 and doc[b, t - j] == doc[b, t]:
                    y[b, t] += w[K - 1 - j] * x[b, t - j]
    return y


def test_matches_a_loop_and_restarts_at_document_starts():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 11, 3)).astype(np.float32)
    w = rng.normal(size=(4, 3)).astype(np.float32)
    seg = np.array([[1] * 5 + [2] * 6, [0, 0] + [3] * 4 + [0] + [4] * 4])
    doc = np.asarray(document_index(jnp.asarray(seg)))
    y = causal_depthwise_conv(jnp.asarray(x), jnp.asarray(w), jnp.asarray(doc))
    np.testing.assert_allclose(y, _loop(x, w, doc), rtol=1e-5, atol=1e-6)
    # Document 2 of row 0 convolved on its own gives the same outputs.
    alone = causal_depthwise_conv(jnp.asarray(x[:1, 5:]), jnp.asarray(w), jnp.zeros((1, 6), jnp.int32))
    np.testing.assert_allclose(y[:1, 5:], alone, rtol=1e-6)


def test_channel_mismatch_raises():
    with pytest.raises(ValueError, match="conv kernel channels"):
        causal_depthwise_conv(jnp.zeros((1, 4, 2, 3)), jnp.zeros((4, 3)), jnp.zeros((1, 4), jnp.int32))
