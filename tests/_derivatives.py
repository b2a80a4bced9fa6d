"""Shared check: a module's value, gradients and a second-order gradient equal a plain formula's."""

import jax
import jax.numpy as jnp
import numpy as np


def assert_same_derivatives(ours, plain, x, params, *, rtol=(1e-12, 1e-10, 1e-9),
                            atol=(0.0, 1e-13, 1e-12)):
    """``ours(x, params)`` and ``plain(x, params)`` (scalar functions, float64) agree in value, in
    their gradients with respect to x and every parameter, and in the parameters' gradient of the
    input gradient's squared norm (second order), to ``rtol``/``atol`` per order."""
    # each derivative jitted: one compilation instead of an op-by-op run
    np.testing.assert_allclose(jax.jit(ours)(x, params), jax.jit(plain)(x, params), rtol=rtol[0],
                               atol=atol[0])
    for g, w in zip(jax.tree.leaves(jax.jit(jax.grad(ours, (0, 1)))(x, params)),
                    jax.tree.leaves(jax.jit(jax.grad(plain, (0, 1)))(x, params)), strict=True):
        np.testing.assert_allclose(g, w, rtol=rtol[1], atol=atol[1])
    def second(f):
        return jax.jit(jax.grad(lambda p: jnp.sum(jax.grad(f)(x, p) ** 2)))(params)
    for g, w in zip(jax.tree.leaves(second(ours)), jax.tree.leaves(second(plain)), strict=True):
        np.testing.assert_allclose(g, w, rtol=rtol[2], atol=atol[2])
