import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.nn.rope import apply_rope, rope_inv_freq


def _rope_reference(x, pos, theta):
    """Complex-number form: z_i = x_i + i x_{i+K/2} multiplied by exp(i p theta^(-2i/K))."""
    K = x.shape[-1]
    freq = theta ** (-np.arange(0, K, 2) / K)
    z = (x[..., : K // 2] + 1j * x[..., K // 2:]) * np.exp(1j * pos[:, :, None, None] * freq)
    return np.concatenate([z.real, z.imag], axis=-1)


def test_matches_complex_rotation_reference():
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        x = rng.normal(size=(2, 5, 3, 8))
        pos = rng.integers(0, 1000, (2, 5))
        got = apply_rope(jnp.asarray(x), jnp.asarray(pos), 500.0)
        assert got.dtype == jnp.float64
        np.testing.assert_allclose(got, _rope_reference(x, pos, 500.0), rtol=1e-12, atol=1e-12)


def test_dot_product_depends_only_on_position_difference():
    with jax.enable_x64(True):
        rng = np.random.default_rng(1)
        q = jnp.asarray(rng.normal(size=(1, 1, 1, 16)))
        k = jnp.asarray(rng.normal(size=(1, 1, 1, 16)))

        def score(p, s):
            qr = apply_rope(q, jnp.array([[p]]), 10000.0)
            kr = apply_rope(k, jnp.array([[s]]), 10000.0)
            return float(jnp.sum(qr * kr))

        for p, s in [(5, 2), (40, 3), (7, 7), (3, 9)]:
            base = score(p, s)
            for shift in (1, 17, 1234):
                assert abs(score(p + shift, s + shift) - base) < 1e-9
        assert abs(score(5, 2) - score(5, 3)) > 1e-6  # and it does depend on the difference


def test_position_zero_is_identity_and_norm_preserved():
    x = jax.random.normal(jax.random.key(0), (2, 4, 2, 8))
    np.testing.assert_array_equal(apply_rope(x, jnp.zeros((2, 4), jnp.int32)), x)
    y = apply_rope(x, jnp.arange(8).reshape(2, 4))
    np.testing.assert_allclose(jnp.linalg.norm(y, axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5)


def test_bfloat16_input_keeps_dtype():
    x = jax.random.normal(jax.random.key(0), (1, 3, 1, 4)).astype(jnp.bfloat16)
    y = apply_rope(x, jnp.arange(3)[None])
    assert y.dtype == jnp.bfloat16
    ref = apply_rope(x.astype(jnp.float32), jnp.arange(3)[None])
    np.testing.assert_allclose(y.astype(jnp.float32), ref, atol=2e-2)


def test_inv_freq_values_and_errors():
    np.testing.assert_allclose(rope_inv_freq(4, 100.0), [1.0, 0.1], rtol=1e-6)
    with pytest.raises(ValueError, match="even head_dim"):
        rope_inv_freq(5)
    with pytest.raises(ValueError, match="positions"):
        apply_rope(jnp.zeros((1, 3, 1, 4)), jnp.zeros((1, 4), jnp.int32))
