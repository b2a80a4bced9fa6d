import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from titans_lm.nn.persistent import PersistentMemory, strip_persistent
from titans_lm.nn.segments import PERSISTENT_SEGMENT_ID


def test_prepend_and_strip():
    with nnx.use_eager_sharding(False):
        mem = PersistentMemory(3, 4, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (2, 5, 4)).astype(jnp.bfloat16)
    seg = jnp.asarray([[1, 1, 2, 2, 0], [3] * 5], jnp.int32)
    xs, ss = mem(x, seg)
    assert xs.shape == (2, 8, 4) and xs.dtype == jnp.bfloat16 and ss.dtype == jnp.int32
    np.testing.assert_array_equal(ss[:, :3], PERSISTENT_SEGMENT_ID)
    np.testing.assert_array_equal(ss[:, 3:], seg)
    np.testing.assert_array_equal(xs[0, :3], mem.tokens[...].astype(jnp.bfloat16))
    np.testing.assert_array_equal(xs[1, :3], xs[0, :3])
    np.testing.assert_array_equal(strip_persistent(xs, 3), x)
    assert tuple(nnx.get_partition_spec(nnx.state(mem))["tokens"].get_value()) == (None, "embed")


def test_errors():
    with pytest.raises(ValueError, match="n_persistent"):
        PersistentMemory(0, 4, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="cannot strip"):
        strip_persistent(jnp.zeros((1, 2, 3)), 3)
