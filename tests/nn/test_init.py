import math

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from titans_lm.nn.init import normal_param, scaled_out_std


def test_normal_param_std_dtype_and_axes():
    with nnx.use_eager_sharding(False):
        p = normal_param(nnx.Rngs(0), (256, 64), 0.05, ("embed", "mlp"), jnp.float32)
    assert p[...].shape == (256, 64) and p[...].dtype == jnp.float32
    assert abs(float(np.std(p[...])) - 0.05) < 0.003
    assert p.get_metadata()["out_sharding"] == ("embed", "mlp")


def test_scaled_out_std():
    assert scaled_out_std(0.02, 12) == pytest.approx(0.02 / math.sqrt(24))
    with pytest.raises(ValueError, match="n_layers"):
        scaled_out_std(0.02, 0)


def test_bad_axes_raise():
    with pytest.raises(ValueError, match="do not match"):
        normal_param(nnx.Rngs(0), (2, 3), 1.0, ("embed",))
    with pytest.raises(ValueError, match="unknown logical axis"):
        normal_param(nnx.Rngs(0), (2, 3), 1.0, ("embed", "model"))
