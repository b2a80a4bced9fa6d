import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from titans_lm.models.blocks import Block


class _ScaleMixer(nnx.Module):
    """A toy token mixer: y_t = 2 * x_t + x_{t-1} inside a segment (enough to see the wiring)."""

    def __call__(self, x, seg):
        prev = jnp.pad(x[:, :-1], ((0, 0), (1, 0), (0, 0)))
        same = jnp.pad(seg[:, 1:] == seg[:, :-1], ((0, 0), (1, 0)))[..., None]
        return 2 * x + jnp.where(same, prev, 0)


def test_block_is_prenorm_residual():
    with nnx.use_eager_sharding(False):
        blk = Block(_ScaleMixer(), d_model=8, d_ff=16, init_std=0.3, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (2, 5, 8))
    seg = jnp.asarray([[1, 1, 1, 2, 2], [3] * 5], jnp.int32)
    h = x + _ScaleMixer()(blk.mixer_norm(x), seg)
    want = h + blk.mlp(blk.mlp_norm(h))
    np.testing.assert_allclose(blk(x, seg), want, rtol=1e-6, atol=1e-6)
    names = sorted(k for k in nnx.state(blk, nnx.Param).keys())
    assert names == ["mixer_norm", "mlp", "mlp_norm"]
