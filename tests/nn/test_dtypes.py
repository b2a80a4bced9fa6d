import jax.numpy as jnp
import pytest

from titans_lm.nn.dtypes import logits_dtype, to_dtype


def test_names_resolve():
    assert to_dtype("bfloat16") == jnp.bfloat16
    assert to_dtype("float32") == jnp.float32
    assert to_dtype(jnp.float32) == jnp.float32
    assert logits_dtype(jnp.bfloat16) == jnp.float32
    assert logits_dtype(jnp.float64) == jnp.float64


def test_unknown_name_raises():
    with pytest.raises(ValueError, match="unknown dtype"):
        to_dtype("float16")
