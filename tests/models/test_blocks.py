import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from titans_lm.models.blocks import Block
from titans_lm.nn.stream import fresh_stream_state, make_stream


class _ScaleMixer(nnx.Module):
    """A toy token mixer: y_t = 2 * x_t + x_{t-1} inside a run, carrying the last token."""

    def init_state(self, batch_size):
        return jnp.zeros((batch_size, 8)), jnp.zeros((batch_size,), jnp.int32)

    def __call__(self, x, stream, state):
        last_x, last_doc = state
        prev = jnp.concatenate([last_x[:, None], x[:, :-1]], axis=1)
        prev_doc = jnp.concatenate([last_doc[:, None], stream.doc_ids[:, :-1]], axis=1)
        same = (prev_doc == stream.doc_ids)[..., None]
        return 2 * x + jnp.where(same, prev, 0), (x[:, -1], stream.doc_ids[:, -1])


def test_block_is_prenorm_residual_and_threads_the_state():
    with nnx.use_eager_sharding(False):
        blk = Block(_ScaleMixer(), d_model=8, d_ff=16, init_std=0.3, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (2, 5, 8))
    seg = jnp.asarray([[1, 1, 1, 2, 2], [3] * 5], jnp.int32)
    stream, _ = make_stream(seg, fresh_stream_state(2))
    h = x + _ScaleMixer()(blk.mixer_norm(x), stream, _ScaleMixer().init_state(2))[0]
    want = h + blk.mlp(blk.mlp_norm(h))
    got, _ = blk(x, stream, blk.init_state(2))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # split after token 2: the carried state continues the run
    s1, mid = make_stream(seg[:, :2], fresh_stream_state(2))
    s2, _ = make_stream(seg[:, 2:], mid)
    y1, st = blk(x[:, :2], s1, blk.init_state(2))
    y2, _ = blk(x[:, 2:], s2, st)
    np.testing.assert_allclose(jnp.concatenate([y1, y2], axis=1), want, rtol=1e-6, atol=1e-6)
    names = sorted(k for k in nnx.state(blk, nnx.Param).keys())
    assert names == ["mixer_norm", "mlp", "mlp_norm"]
