import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from titans_lm.nn.persistent import PersistentMemory
from titans_lm.nn.segments import PERSISTENT_SEGMENT_ID


def test_prefix_for_every_row():
    with nnx.use_eager_sharding(False):
        mem = PersistentMemory(3, 4, rngs=nnx.Rngs(0))
    x, ids = mem(2, jnp.bfloat16)
    assert x.shape == (2, 3, 4) and x.dtype == jnp.bfloat16 and ids.dtype == jnp.int32
    np.testing.assert_array_equal(ids, PERSISTENT_SEGMENT_ID)
    np.testing.assert_array_equal(x[0], mem.tokens[...].astype(jnp.bfloat16))
    np.testing.assert_array_equal(x[1], x[0])
    assert tuple(nnx.get_partition_spec(nnx.state(mem))["tokens"].get_value()) == (None, "embed")


def test_errors():
    with pytest.raises(ValueError, match="n_persistent"):
        PersistentMemory(0, 4, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="batch_size"):
        with nnx.use_eager_sharding(False):
            PersistentMemory(2, 4, rngs=nnx.Rngs(0))(0, jnp.float32)
