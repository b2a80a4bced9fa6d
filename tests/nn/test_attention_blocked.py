"""Banded sliding-window attention (``blocked_window_attention``) against the dense masked form."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from titans_lm.nn.attention import (Attention, KVCache, blocked_window_attention, cache_mask,
                                    dot_product_attention)
from titans_lm.nn.segments import PERSISTENT_SEGMENT_ID
from titans_lm.nn.stream import fresh_stream_state, make_stream


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


def _case(W, nb, cached, n_p, seed=0):
    B, H, K = 2, 2, 4
    T = W * nb
    C = W if cached else 0
    r = np.random.default_rng(seed)
    offset = 7 if cached else 0
    # runs: a document continuing from the cache, a boundary inside a block, one at a block start
    doc = np.zeros((B, C + T), np.int32)
    for b in range(B):
        cuts = sorted(r.choice(np.arange(1, C + T), size=min(3, C + T - 1), replace=False))
        doc[b] = np.searchsorted(cuts, np.arange(C + T), side="right") + 10 * b
    index = np.broadcast_to(np.arange(C + T) + offset - C, (B, C + T)).astype(np.int32)
    valid = np.ones((B, C + T), bool)
    if cached:
        valid[:, : W // 2] = False          # a cache that is not full yet (empty slots first)
    rnd = lambda *s: jnp.asarray(r.normal(size=s))  # noqa: E731
    stream = KVCache(rnd(B, C + T, H, K), rnd(B, C + T, H, K), jnp.asarray(doc),
                     jnp.asarray(index), jnp.asarray(valid))
    persistent = None
    if n_p:
        pvalid = np.ones((B, n_p), bool)
        pvalid[1, -1] = False
        persistent = KVCache(rnd(B, n_p, H, K), rnd(B, n_p, H, K),
                             jnp.full((B, n_p), PERSISTENT_SEGMENT_ID, jnp.int32),
                             jnp.zeros((B, n_p), jnp.int32), jnp.asarray(pvalid))
    q = rnd(B, T, H, K)
    return q, stream.doc[:, C:], stream.index[:, C:], stream, persistent


def _dense(q, q_doc, q_index, stream, persistent, W):
    keys = stream if persistent is None else KVCache(
        *(jnp.concatenate([a, b], axis=1) for a, b in zip(persistent, stream)))
    return dot_product_attention(q, keys.k, keys.v, cache_mask(q_doc, q_index, keys, W))


@pytest.mark.parametrize("W,nb,cached,n_p", [(1, 3, False, 0), (3, 2, False, 2), (4, 3, True, 0),
                                             (4, 4, True, 3), (2, 5, False, 1)])
def test_equals_the_dense_masked_attention_values_and_gradients(W, nb, cached, n_p):
    q, q_doc, q_index, stream, persistent = _case(W, nb, cached, n_p)

    def loss(fn):
        def f(q, k, v):
            s = stream._replace(k=k, v=v)
            return jnp.sum(jnp.sin(fn(q, q_doc, q_index, s, persistent, W)))
        return f

    np.testing.assert_allclose(
        blocked_window_attention(q, q_doc, q_index, stream, persistent, W),
        _dense(q, q_doc, q_index, stream, persistent, W), rtol=1e-12, atol=1e-12)
    got = jax.jit(jax.grad(loss(blocked_window_attention), (0, 1, 2)))(q, stream.k, stream.v)
    want = jax.jit(jax.grad(loss(_dense), (0, 1, 2)))(q, stream.k, stream.v)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-12)


def test_bad_shapes_are_refused():
    q, q_doc, q_index, stream, _ = _case(4, 2, False, 0)
    with pytest.raises(ValueError, match="T % W"):
        blocked_window_attention(q, q_doc, q_index, stream, None, 3)


def test_the_module_gives_the_same_output_on_the_banded_and_dense_paths():
    """A window call of T = 4W (banded) equals the same tokens fed as calls of W (dense)."""
    W, T = 4, 16
    with nnx.use_eager_sharding(False):
        attn = Attention(16, 2, window=W, dtype=jnp.float64, param_dtype=jnp.float64,
                         init_std=0.3, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (2, T, 16), jnp.float64)
    seg = jnp.asarray(np.repeat([[1, 1, 2, 2], [3, 3, 3, 4]], T // 4, axis=1), jnp.int32)
    stream, _ = make_stream(seg, fresh_stream_state(2), fresh=True, no_persistent=True)
    whole, _ = attn(x, stream, attn.init_state(2))
    dense, _ = attn(x, make_stream(seg, fresh_stream_state(2), fresh=True)[0], attn.init_state(2))
    np.testing.assert_allclose(whole, dense, rtol=1e-12, atol=1e-13)
    st, s_state, parts = attn.init_state(2), fresh_stream_state(2), []
    for i in range(0, T, W):
        s, s_state = make_stream(seg[:, i:i + W], s_state, fresh=(i == 0))
        y, st = attn(x[:, i:i + W], s, st)
        parts.append(y)
    np.testing.assert_allclose(whole, jnp.concatenate(parts, axis=1), rtol=1e-12, atol=1e-13)

