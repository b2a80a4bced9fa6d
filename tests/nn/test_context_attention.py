import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from titans_lm.nn.context_attention import ContextAttention, context_mask
from titans_lm.nn.rope import apply_rope

D, H, NP = 16, 2, 3


def _attn(n_persistent=NP, seed=0, dtype=jnp.float32):
    with nnx.use_eager_sharding(False):
        return ContextAttention(D, H, n_persistent=n_persistent, rope_theta=100.0, init_std=0.3,
                                dtype=dtype, param_dtype=dtype, rngs=nnx.Rngs(seed))


def _reference(attn, x, doc, pos, h):
    """Token-by-token softmax attention in float64 with explicit visibility rules."""
    B, N, _ = x.shape
    wq, wk, wv, wo = (np.asarray(w[...], np.float64) for w in (attn.w_q, attn.w_k, attn.w_v, attn.w_o))
    p = np.asarray(attn.persistent[...], np.float64) if attn.n_persistent else np.zeros((0, D))
    rot = lambda a, ps: np.asarray(apply_rope(jnp.asarray(a)[None], jnp.asarray(ps)[None],  # noqa: E731
                                              attn.rope_theta))[0]
    out = np.zeros((B, N, D))
    for b in range(B):
        q = rot(np.einsum("nd,dhk->nhk", x[b], wq), pos[b])
        keys = [np.einsum("pd,dhk->phk", p, wk)]
        vals = [np.einsum("pd,dhk->phk", p, wv)]
        visible = [np.ones((N, len(p)), bool)]
        blocks = [x[b]] if h is None else [h[b], x[b]]
        same = (doc[b][:, None] == doc[b][None, :]) & (np.arange(N)[None, :] <= np.arange(N)[:, None])
        for a in blocks:
            keys.append(rot(np.einsum("nd,dhk->nhk", a, wk), pos[b]))
            vals.append(np.einsum("nd,dhk->nhk", a, wv))
            visible.append(same)
        k, v, vis = np.concatenate(keys), np.concatenate(vals), np.concatenate(visible, axis=1)
        for i in range(N):
            o = np.zeros((H, attn.head_dim))
            for hh in range(H):
                s = k[:, hh] @ q[i, hh] / np.sqrt(attn.head_dim)
                s = np.where(vis[i], s, -np.inf)
                w = np.exp(s - s.max())
                o[hh] = (w / w.sum()) @ v[:, hh]
            out[b, i] = np.einsum("hk,hkd->d", o, wo)
    return out


def _inputs(seed=1, N=8):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, N, D))
    h = rng.normal(size=(2, N, D))
    doc = np.array([[1] * N, [1, 1, 1, 2, 2, 2, 3, 3]])
    pos = np.array([list(range(N)), [0, 1, 2, 0, 1, 2, 0, 1]])
    return x, h, doc, pos


@pytest.mark.parametrize("with_h", [True, False])
@pytest.mark.parametrize("n_persistent", [0, NP])
def test_matches_token_by_token_reference(with_h, n_persistent):
    attn = _attn(n_persistent)
    x, h, doc, pos = _inputs()
    got = attn(jnp.asarray(x, jnp.float32), jnp.asarray(doc), jnp.asarray(pos),
               jnp.asarray(h, jnp.float32) if with_h else None)
    assert got.shape == (2, 8, D) and got.dtype == jnp.float32
    want = _reference(attn, x, doc, pos, h if with_h else None)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)


def test_mask_layout():
    doc = jnp.asarray([[1, 1, 2, 2]])
    m = np.asarray(context_mask(doc, 2, 2))[0, 0]
    assert m.shape == (4, 2 + 4 + 4)
    assert m[:, :2].all()  # persistent keys visible to every query
    block = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]], bool)
    np.testing.assert_array_equal(m[:, 2:6], block)  # h: causal, own document
    np.testing.assert_array_equal(m[:, 6:], block)  # segment tokens: the same rule
    with pytest.raises(ValueError, match="n_aligned"):
        context_mask(doc, 0, 0)


def test_future_memory_tokens_and_other_documents_are_invisible():
    with jax.enable_x64(True):
        attn = _attn(dtype=jnp.float64)
        x, h, doc, pos = (jnp.asarray(a) for a in _inputs())
        base = np.asarray(attn(x, doc, pos, h))
        j = 5
        h2 = h.at[:, j].add(3.0)
        x2 = x.at[:, j].add(3.0)
        for y in (np.asarray(attn(x, doc, pos, h2)), np.asarray(attn(x2, doc, pos, h))):
            np.testing.assert_array_equal(y[:, :j], base[:, :j])
            assert np.abs(y[0, j] - base[0, j]).max() > 1e-6
        # row 1: document 3 starts at 6; changing document 2 (positions 3-5) leaves it alone
        y = np.asarray(attn(x2.at[1, 3].add(1.0), doc, pos, h2))
        np.testing.assert_array_equal(y[1, 6:], base[1, 6:])


def test_persistent_tokens_are_parameters_and_change_outputs():
    attn = _attn()
    assert attn.persistent[...].shape == (NP, D)
    assert attn.persistent.get_metadata()["out_sharding"] == (None, "embed")
    assert _attn(0).persistent is None
    x, h, doc, pos = (jnp.asarray(a, jnp.float32) for a in _inputs())
    doc, pos = doc.astype(jnp.int32), pos.astype(jnp.int32)
    base = attn(x, doc, pos, h)
    attn.persistent[...] = attn.persistent[...] + 1.0
    assert float(jnp.abs(attn(x, doc, pos, h) - base).max()) > 1e-4


def test_bad_shapes_are_named():
    attn = _attn()
    x, h, doc, pos = (jnp.asarray(a) for a in _inputs())
    with pytest.raises(ValueError, match="expects x"):
        attn(x[..., :4], doc, pos)
    with pytest.raises(ValueError, match="doc and pos"):
        attn(x, doc[:, :3], pos)
    with pytest.raises(ValueError, match="shape of x"):
        attn(x, doc, pos, h[:, :3])
    with pytest.raises(ValueError, match="n_persistent"):
        _attn(-1)
