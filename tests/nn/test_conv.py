import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from titans_lm.nn.conv import ShortConv, causal_depthwise_conv


def _reference(x, w, seg):
    B, T, C = x.shape
    y = np.zeros_like(x)
    for b in range(B):
        for t in range(T):
            start = t
            while start > 0 and seg[b, start - 1] == seg[b, t]:
                start -= 1
            for i in range(w.shape[0]):
                if t - i >= start:
                    y[b, t] += w[i] * x[b, t - i]
    return y


@pytest.mark.parametrize("K", [1, 3, 4, 9])
def test_matches_loop_reference(K):
    with jax.enable_x64(True):
        rng = np.random.default_rng(K)
        x = rng.normal(size=(2, 10, 3))
        w = rng.normal(size=(K, 3))
        seg = np.array([[1, 1, 1, 2, 2, 2, 2, 2, 0, 0], [0, 0, 3, 3, 3, 3, 3, 3, 3, 3]], np.int32)
        got = causal_depthwise_conv(jnp.asarray(x), jnp.asarray(w), jnp.asarray(seg))
        np.testing.assert_allclose(got, _reference(x, w, seg), rtol=1e-12, atol=1e-12)


def test_document_outputs_ignore_previous_document():
    with nnx.use_eager_sharding(False):
        conv = ShortConv(5, kernel_size=4, rngs=nnx.Rngs(0))
    seg = jnp.asarray([[1] * 6 + [2] * 6], jnp.int32)
    x = jax.random.normal(jax.random.key(0), (1, 12, 5))
    y0 = conv(x, seg)
    y1 = conv(x.at[0, :6].set(jax.random.normal(jax.random.key(1), (6, 5))), seg)
    np.testing.assert_array_equal(y0[0, 6:], y1[0, 6:])
    assert not np.array_equal(y0[0, :6], y1[0, :6])
    # and inside a document the taps do reach back
    y2 = conv(x.at[0, 7].add(1.0), seg)
    assert np.all(np.any(np.asarray(y0[0, 7:11] != y2[0, 7:11]), axis=-1))
    np.testing.assert_array_equal(y0[0, 11], y2[0, 11])


def test_module_init_and_axes():
    with nnx.use_eager_sharding(False):
        conv = ShortConv(64, kernel_size=4, rngs=nnx.Rngs(0), axes=(None, "memory"))
    w = np.asarray(conv.w[...])
    assert w.shape == (4, 64) and np.all(np.abs(w) <= 0.5) and w.min() < 0 < w.max()
    assert tuple(nnx.get_partition_spec(nnx.state(conv))["w"].get_value()) == (None, "memory")


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="conv wants"):
        causal_depthwise_conv(jnp.zeros((1, 4, 3)), jnp.zeros((2, 4)), jnp.ones((1, 4), jnp.int32))
    with pytest.raises(ValueError, match="unknown logical axis"):
        ShortConv(3, rngs=nnx.Rngs(0), axes=(None, "chan"))


def test_trailing_channel_shape_equals_flattened_channels():
    """The memory layer convolves [B, T, H, head_dim] per (head, channel): the same as [B, T, H*Dh]."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 9, 3, 4)).astype(np.float32)
    w = rng.normal(size=(4, 3, 4)).astype(np.float32)
    seg = jnp.asarray([[1] * 4 + [2] * 5, [0, 0] + [3] * 7], jnp.int32)
    got = causal_depthwise_conv(jnp.asarray(x), jnp.asarray(w), seg)
    flat = causal_depthwise_conv(jnp.asarray(x.reshape(2, 9, 12)), jnp.asarray(w.reshape(4, 12)), seg)
    np.testing.assert_allclose(np.asarray(got).reshape(2, 9, 12), flat, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="conv wants"):
        causal_depthwise_conv(jnp.asarray(x), jnp.zeros((4, 4, 3)), seg)
