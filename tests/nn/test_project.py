"""``project``: values, gradients and second-order gradients equal the plain einsum's (float64)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.nn.project import project


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


CASES = [  # (x shape, w shape, n_in, einsum)
    ((2, 5, 6), (6, 3, 4), 1, "btd,dhk->bthk"),
    ((2, 5, 3, 4), (3, 4, 6), 2, "bthk,hkd->btd"),
    ((7, 6), (6, 5), 1, "td,de->te"),
]


@pytest.mark.parametrize("xs,ws,n_in,spec", CASES)
def test_values_and_gradients_equal_the_einsum(x64, xs, ws, n_in, spec):
    kx, kw, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, xs, jnp.float64)
    w = jax.random.normal(kw, ws, jnp.float64)
    ref = jnp.einsum(spec, x, w)
    out = project(x, w, n_in)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    np.testing.assert_allclose(out, ref, rtol=1e-13, atol=1e-13)

    g = jax.random.normal(kg, ref.shape, jnp.float64)

    def loss(f):
        return lambda x, w: jnp.sum(jnp.sin(f(x, w)) * g)
    mine, plain = loss(lambda x, w: project(x, w, n_in)), loss(lambda x, w: jnp.einsum(spec, x, w))
    for a, b in zip(jax.grad(mine, (0, 1))(x, w), jax.grad(plain, (0, 1))(x, w)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)

    # second order (a meta-gradient through the backward): d/dw of sum(dL/dx ** 2)
    def meta(f):
        return lambda x, w: jnp.sum(jax.grad(f, 0)(x, w) ** 2)
    for a, b in zip(jax.grad(meta(mine), (0, 1))(x, w), jax.grad(meta(plain), (0, 1))(x, w)):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-11)


def test_mixed_dtypes_promote_and_cotangents_keep_their_dtypes():
    x = jnp.ones((3, 4), jnp.bfloat16)
    w = jnp.ones((4, 2), jnp.float32)
    assert project(x, w).dtype == jnp.float32
    gx, gw = jax.grad(lambda x, w: jnp.sum(project(x, w)), (0, 1))(x, w)
    assert gx.dtype == jnp.bfloat16 and gw.dtype == jnp.float32
    np.testing.assert_array_equal(gx, 2.0)
    np.testing.assert_array_equal(gw, 3.0)


@pytest.mark.parametrize("xs,ws,n_in", [((2, 5), (4, 3), 1), ((2, 3, 4), (4, 3, 2), 2),
                                         ((2, 3), (3, 2), 0)])
def test_mismatched_shapes_name_both(xs, ws, n_in):
    with pytest.raises(ValueError, match="project: the last"):
        project(jnp.ones(xs), jnp.ones(ws), n_in)


def test_the_custom_gradient_is_cpu_only_and_forward_mode_selects_the_einsum(x64):
    """On the CPU backend ``project`` traces its custom VJP (no forward mode); inside
    ``forward_mode()`` it is the plain matmul, so ``jax.jvp`` works and equals the einsum's."""
    from titans_lm.nn.project import forward_mode, uses_custom_gradient
    x = jax.random.normal(jax.random.key(1), (2, 5, 6), jnp.float64)
    w = jax.random.normal(jax.random.key(2), (6, 3, 4), jnp.float64)
    dx, dw = jnp.ones_like(x), jnp.full_like(w, 0.5)
    assert uses_custom_gradient() == (jax.default_backend() == "cpu")
    if jax.default_backend() == "cpu":
        assert "custom_vjp" in str(jax.make_jaxpr(project)(x, w))
        with pytest.raises(TypeError, match="custom_vjp"):
            jax.jvp(project, (x, w), (dx, dw))
    with forward_mode():
        assert not uses_custom_gradient()
        # a fresh function: jax caches traces by function, not by this setting
        assert "custom_vjp" not in str(jax.make_jaxpr(lambda a, b: project(a, b))(x, w))
        out, tangent = jax.jvp(lambda a, b: project(a, b), (x, w), (dx, dw))
    assert uses_custom_gradient() == (jax.default_backend() == "cpu")  # restored
    ref, ref_t = jax.jvp(lambda a, b: jnp.einsum("btd,dhk->bthk", a, b), (x, w), (dx, dw))
    np.testing.assert_allclose(out, ref, rtol=1e-13)
    np.testing.assert_allclose(tangent, ref_t, rtol=1e-13)
