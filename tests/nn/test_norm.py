import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from titans_lm.nn.norm import RMSNorm


def test_matches_reference_with_scale():
    with nnx.use_eager_sharding(False):
        norm = RMSNorm(8, eps=1e-5, rngs=nnx.Rngs(0))
    norm.scale[...] = jnp.arange(1.0, 9.0)
    x = np.random.default_rng(0).normal(size=(2, 3, 8)).astype(np.float32)
    want = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, -1, keepdims=True) + 1e-5) * np.arange(1, 9)
    np.testing.assert_allclose(norm(jnp.asarray(x)), want, rtol=1e-5)


def test_bfloat16_output_float32_statistics():
    with nnx.use_eager_sharding(False):
        norm = RMSNorm(64, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    # large values whose squares overflow bfloat16 precision: statistics must be in float32
    x = (jax.random.normal(jax.random.key(0), (4, 64)) * 300.0).astype(jnp.bfloat16)
    y = norm(x)
    assert y.dtype == jnp.bfloat16 and norm.scale[...].dtype == jnp.float32
    xf = x.astype(jnp.float32)
    want = xf / jnp.sqrt(jnp.mean(xf ** 2, -1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(y.astype(jnp.float32), want, atol=2e-2, rtol=1e-2)


def test_scale_axis_metadata_and_errors():
    with nnx.use_eager_sharding(False):
        norm = RMSNorm(4, axis="head_dim", rngs=nnx.Rngs(0))
    assert tuple(nnx.get_partition_spec(nnx.state(norm))["scale"].get_value()) == ("head_dim",)
    with pytest.raises(ValueError, match="unknown logical axis"):
        RMSNorm(4, axis="features", rngs=nnx.Rngs(0))
