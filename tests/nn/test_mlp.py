import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from _derivatives import assert_same_derivatives
from titans_lm.nn.mlp import SwiGLU


def test_matches_reference_and_axes():
    with nnx.use_eager_sharding(False):
        mlp = SwiGLU(8, 12, init_std=0.5, out_init_std=0.1, rngs=nnx.Rngs(0))
    x = np.random.default_rng(0).normal(size=(2, 3, 8))
    g, u, d = (np.asarray(w[...], np.float64) for w in (mlp.w_gate, mlp.w_up, mlp.w_down))
    a = x @ g
    want = (a / (1 + np.exp(-a)) * (x @ u)) @ d
    np.testing.assert_allclose(mlp(jnp.asarray(x, jnp.float32)), want, rtol=1e-4, atol=1e-5)
    specs = nnx.get_partition_spec(nnx.state(mlp))
    assert tuple(specs["w_up"].get_value()) == ("embed", "mlp")
    assert tuple(specs["w_down"].get_value()) == ("mlp", "embed")
    assert np.std(d) < 0.2 < np.std(g)  # out_init_std used for W_down


def test_no_biases_and_bfloat16():
    with nnx.use_eager_sharding(False):
        mlp = SwiGLU(8, 12, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    assert sorted(nnx.state(mlp, nnx.Param).keys()) == ["w_down", "w_gate", "w_up"]
    assert mlp(jnp.ones((1, 8))).dtype == jnp.bfloat16
    np.testing.assert_array_equal(mlp(jnp.zeros((1, 8))), 0)
    with pytest.raises(ValueError, match="d_ff"):
        SwiGLU(8, 0, rngs=nnx.Rngs(0))


def test_gradients_match_plain_einsum_float64():
    """The projections' custom backward (titans_lm.nn.project): first- and second-order gradients
    equal those of the plain einsum formula."""
    with jax.enable_x64(True):
        with nnx.use_eager_sharding(False):
            mlp = SwiGLU(8, 12, init_std=0.5, dtype=jnp.float64, param_dtype=jnp.float64,
                         rngs=nnx.Rngs(0))
        graphdef, params = nnx.split(mlp, nnx.Param)
        x = jax.random.normal(jax.random.key(1), (2, 3, 8), jnp.float64)
        c = jax.random.normal(jax.random.key(2), (2, 3, 8), jnp.float64)

        def ours(x, params):
            return jnp.sum(nnx.merge(graphdef, params)(x) * c)

        def plain(x, params):
            g, u, d = (params[n][...] for n in ("w_gate", "w_up", "w_down"))
            h = jax.nn.silu(jnp.einsum("btd,df->btf", x, g)) * jnp.einsum("btd,df->btf", x, u)
            return jnp.sum(jnp.einsum("btf,fd->btd", h, d) * c)

        assert_same_derivatives(ours, plain, x, params, rtol=(1e-13, 1e-12, 1e-11),
                                atol=(0.0, 1e-14, 1e-13))
