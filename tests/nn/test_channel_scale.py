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


def test_the_custom_gradient_is_cpu_only_and_forward_mode_selects_the_product():
    from titans_lm.nn.cpu_gradients import forward_mode
    x, w = jnp.arange(12.0).reshape(2, 2, 3), jnp.array([0.5, -1.0, 2.0])
    dx, dw = jnp.ones_like(x), jnp.full_like(w, 0.25)
    if jax.default_backend() == "cpu":
        assert "custom_vjp" in str(jax.make_jaxpr(channel_scale)(x, w))
        with pytest.raises(TypeError, match="custom_vjp"):
            jax.jvp(channel_scale, (x, w), (dx, dw))
    with forward_mode():
        out, tangent = jax.jvp(lambda a, b: channel_scale(a, b), (x, w), (dx, dw))
    np.testing.assert_array_equal(out, x * w)
    np.testing.assert_allclose(tangent, dx * w + x * dw, rtol=1e-6)
