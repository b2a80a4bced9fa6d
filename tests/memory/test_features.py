"""Atlas' polynomial feature map (titans_lm/memory/features.py) and the layer whose memory's key
width follows it, in float64: degree 1 is the identity exactly; the features are Atlas'
monomials with the coefficients that make phi_p(q) . phi_p(k) the Taylor series of exp(q . k)
(a hand-computed vector); the layer's W0 widens, its chunked engine equals the token loop; bad
values get one clear message. Split calls with the carried state: tests/memory/test_state.py."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from titans_lm.memory.config import MemoryConfig
from titans_lm.memory.features import poly_features, poly_width
from titans_lm.memory.layer import NeuralMemory
from _memory_call import call_fresh


def test_degree_1_is_the_identity_and_the_width_is_a_binomial():
    x = jax.random.normal(jax.random.key(0), (3, 5, 16))
    np.testing.assert_array_equal(poly_features(x, 1), x)
    assert poly_features(x, 2).shape == (3, 5, 152) == (3, 5, poly_width(16, 2))
    assert [poly_width(3, p) for p in (1, 2, 3)] == [3, 9, 19]   # C(3 + p, p) - 1


def test_the_features_are_atlas_monomials():
    """x = (1, 2, 3), p = 2: degree 1, then x_i x_j (i <= j) times sqrt(multinomial / 2!):
    1/sqrt(2) on the squares, 1 on the products of two different coordinates."""
    r = 1 / math.sqrt(2)
    want = [1, 2, 3, 1 * r, 2, 3, 4 * r, 6, 9 * r]
    with jax.enable_x64(True):
        np.testing.assert_allclose(poly_features(jnp.array([1.0, 2.0, 3.0]), 2), want, rtol=1e-15)
        q, k = jnp.array([0.3, -0.5, 0.7, 0.1]), jnp.array([0.2, 0.9, -0.4, 0.5])
        for p in (1, 2, 3):   # Atlas' kernel view: sum_{i<=p} a_i (q . k)^i with a_i = 1/i!
            want = sum(float(q @ k) ** i / math.factorial(i) for i in range(1, p + 1))
            np.testing.assert_allclose(poly_features(q, p) @ poly_features(k, p), want, rtol=1e-14)


def _layer(impl, depth):
    cfg = MemoryConfig(d_model=8, n_heads=2, head_dim=3, chunk_size=4, memory_depth=depth,
                       memory_expansion=2.0, feature_map="poly", feature_degree=2, theta_max=0.5,
                       impl=impl, dtype="float64", param_dtype="float64")
    return NeuralMemory(cfg, rngs=nnx.Rngs(0))


def test_the_memory_key_width_follows_and_chunked_equals_the_token_loop():
    with jax.enable_x64(True):
        layer = _layer("chunked", 2)
        assert layer.cfg.key_width == 9
        assert [tuple(w.shape) for w in layer.w0] == [(2, 9, 6), (2, 6, 3)]   # hidden 2 * head_dim
        x = jax.random.normal(jax.random.key(1), (2, 10, 8), jnp.float64)
        ids = jnp.array([[1] * 10, [1] * 6 + [2] * 4])    # a document start inside a chunk
        got = call_fresh(layer, x, ids)
        want = call_fresh(_layer("reference", 2), x, ids)
        assert bool(jnp.all(jnp.isfinite(got)))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)


def test_bad_values_get_one_clear_message():
    with pytest.raises(ValueError, match="feature_degree: must be an integer >= 1"):
        MemoryConfig(d_model=8, feature_map="poly", feature_degree=0)
    with pytest.raises(ValueError, match="'poly' widens the keys.*memory_residual_ln"):
        MemoryConfig(d_model=8, feature_map="poly", memory_residual_ln=True, memory_depth=1)
    with pytest.raises(ValueError, match="feature_map: must be one of"):
        MemoryConfig(d_model=8, feature_map="polynomial")
    with pytest.raises(ValueError, match="feature_degree must be an integer >= 1, got 0"):
        poly_features(jnp.ones(3), 0)
