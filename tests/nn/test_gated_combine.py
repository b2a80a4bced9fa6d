import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from titans_lm.nn.gated_combine import GatedCombine

D = 8


def _combine(seed=0):
    with nnx.use_eager_sharding(False):
        return GatedCombine(D, norm_eps=1e-6, out_init_std=0.5, rngs=nnx.Rngs(seed))


def test_matches_formula():
    g = _combine()
    g.norm_y.scale[...] = jnp.linspace(0.5, 1.5, D)
    g.norm_m.scale[...] = jnp.linspace(2.0, -1.0, D)
    rng = np.random.default_rng(0)
    y, m = rng.normal(size=(2, 3, D)), rng.normal(size=(2, 3, D))
    rms = lambda a, s: a / np.sqrt(np.mean(a ** 2, -1, keepdims=True) + 1e-6) * s  # noqa: E731
    ys, ms = np.asarray(g.norm_y.scale[...]), np.asarray(g.norm_m.scale[...])
    want = (rms(y, ys) / (1 + np.exp(-rms(m, ms)))) @ np.asarray(g.w_o[...])
    got = g(jnp.asarray(y, jnp.float32), jnp.asarray(m, jnp.float32))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_memory_branch_gates_and_is_scale_free():
    g = _combine()
    y, m = jax.random.normal(jax.random.key(1), (2, 1, 4, D))
    base = g(y, m)
    np.testing.assert_allclose(g(3.0 * y, 5.0 * m), base, rtol=1e-5, atol=1e-6)  # both normalised
    assert float(jnp.abs(g(y, -m) - base).max()) > 1e-3  # the gate depends on m


def test_parameters_and_errors():
    g = _combine()
    assert g.w_o[...].shape == (D, D) and g.w_o.get_metadata()["out_sharding"] == (None, "embed")
    with pytest.raises(ValueError, match="one shape"):
        g(jnp.zeros((1, 2, D)), jnp.zeros((1, 3, D)))
