"""channel_scale: x * w with a contraction for the weight gradient, exact against the plain product."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.nn.channel_scale import channel_scale


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("x_shape,w_shape", [((2, 5, 3), (3,)), ((2, 7, 4, 3), (4, 3)),
                                             ((6,), (6,))])
def test_values_and_gradients_equal_the_plain_product(x_shape, w_shape):
    kx, kw, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, x_shape, jnp.float64)
    w = jax.random.normal(kw, w_shape, jnp.float64)
    g = jax.random.normal(kg, x_shape, jnp.float64)
    np.testing.assert_array_equal(channel_scale(x, w), x * w)

    def loss(f):
        return lambda x, w: jnp.sum(jnp.sin(f(x, w)) * g)

    plain = lambda x, w: x * w  # noqa: E731
    for a, b in zip(jax.grad(loss(channel_scale), (0, 1))(x, w), jax.grad(loss(plain), (0, 1))(x, w)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)
    # reverse over reverse (meta-gradients through a layer that uses it)
    def gnorm(f):
        return lambda x, w: jnp.sum(jax.grad(loss(f), 1)(x, w) ** 2)
    for a, b in zip(jax.grad(gnorm(channel_scale), (0, 1))(x, w), jax.grad(gnorm(plain), (0, 1))(x, w)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_mixed_dtypes_keep_each_input_dtype_in_its_gradient():
    x = jnp.ones((2, 3, 4), jnp.bfloat16)
    w = jnp.arange(4, dtype=jnp.float32)
    y = channel_scale(x, w)
    assert y.dtype == jnp.float32
    dx, dw = jax.grad(lambda x, w: jnp.sum(channel_scale(x, w)), (0, 1))(x, w)
    assert dx.dtype == jnp.bfloat16 and dw.dtype == jnp.float32
    np.testing.assert_allclose(dw, np.full(4, 6.0))


def test_a_weight_that_is_not_the_trailing_shape_is_refused():
    with pytest.raises(ValueError, match="trailing shape"):
        channel_scale(jnp.ones((2, 3)), jnp.ones((2,)))
