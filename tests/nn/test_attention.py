import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from _derivatives import assert_same_derivatives
from titans_lm.nn.attention import Attention
from titans_lm.nn.segments import PERSISTENT_SEGMENT_ID, attention_mask, document_ids, segment_positions
from titans_lm.nn.rope import apply_rope
from titans_lm.nn.stream import fresh_stream_state, make_stream

P = PERSISTENT_SEGMENT_ID
D, H = 16, 2


def _attn(window=None, seed=0, **kw):
    with nnx.use_eager_sharding(False):
        return Attention(D, H, window=window, rope_theta=1000.0, init_std=0.3, rngs=nnx.Rngs(seed),
                         **kw)


def _call(attn, x, seg):
    """One fresh call (the training path)."""
    stream, _ = make_stream(jnp.asarray(seg), fresh_stream_state(x.shape[0]), fresh=True)
    return attn(x, stream, attn.init_state(x.shape[0]))[0]


def _plain(x, ws, seg, window, rope_theta):
    """Plain einsum/softmax attention (traceable) with the same mask; ws = (w_q, w_k, w_v, w_o)."""
    wq, wk, wv, wo = ws
    pos = segment_positions(seg)
    q = apply_rope(jnp.einsum("btd,dhk->bthk", x, wq), pos, rope_theta)
    k = apply_rope(jnp.einsum("btd,dhk->bthk", x, wk), pos, rope_theta)
    v = jnp.einsum("btd,dhk->bthk", x, wv)
    ids = document_ids(seg)
    mask = attention_mask(ids, ids, window=window)  # [B,1,T,T]
    s = jnp.einsum("bthk,bshk->bhts", q, k) / np.sqrt(q.shape[-1])
    s = jnp.where(mask, s, -jnp.inf)
    o = jnp.einsum("bhts,bshk->bthk", jax.nn.softmax(s, axis=-1), v)
    return jnp.einsum("bthk,hkd->btd", o, wo)


def _reference(attn, x, seg, window):
    """``_plain`` in float64 with the module's weights."""
    with jax.enable_x64(True):
        ws = tuple(jnp.asarray(w[...], jnp.float64) for w in (attn.w_q, attn.w_k, attn.w_v, attn.w_o))
        return np.asarray(_plain(jnp.asarray(x, jnp.float64), ws, seg, window, attn.rope_theta))


SEGS = [
    np.array([[1] * 12, [1] * 5 + [2] * 4 + [0] * 3]),
    np.array([[P, P, 1, 1, 1, 1, 1, 2, 2, 2, 0, 0], [P, P] + [3] * 10]),
]


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("seg_i", [0, 1])
def test_matches_plain_softmax_reference(window, seg_i):
    attn = _attn(window)
    seg = jnp.asarray(SEGS[seg_i], jnp.int32)
    x = jax.random.normal(jax.random.key(1), (2, 12, D))
    got = _call(attn, x, seg)
    assert got.shape == (2, 12, D) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, _reference(attn, x, seg, window), rtol=2e-5, atol=2e-6)


def test_sliding_window_forgets_tokens_outside_it():
    attn, w = _attn(window=4), 4
    seg = jnp.ones((1, 16), jnp.int32)
    x = jax.random.normal(jax.random.key(2), (1, 16, D))
    j = 5
    y0 = _call(attn, x, seg)
    y1 = _call(attn, x.at[0, j].add(1.0), seg)
    changed = np.any(np.asarray(y0 != y1), axis=-1)[0]
    np.testing.assert_array_equal(changed, [j <= i < j + w for i in range(16)])


def test_document_output_equals_document_alone():
    attn = _attn()
    x = jax.random.normal(jax.random.key(3), (1, 16, D))
    seg = jnp.asarray([[1] * 8 + [2] * 8], jnp.int32)
    packed = _call(attn, x, seg)
    alone = _call(attn, x[:, 8:], jnp.ones((1, 8), jnp.int32))
    np.testing.assert_allclose(packed[:, 8:], alone, rtol=1e-5, atol=1e-6)


def test_persistent_prefix_visibility():
    attn = _attn(window=2)
    seg = jnp.asarray([[P, P, 1, 1, 1, 1, 1, 1]], jnp.int32)
    x = jax.random.normal(jax.random.key(4), (1, 8, D))
    y0 = _call(attn, x, seg)
    # persistent outputs do not depend on real tokens
    y1 = _call(attn, x.at[0, 2:].add(1.0), seg)
    np.testing.assert_array_equal(y0[0, :2], y1[0, :2])
    # every real token (even beyond the window) depends on the first persistent token
    y2 = _call(attn, x.at[0, 0].add(1.0), seg)
    assert np.all(np.any(np.asarray(y0[0] != y2[0]), axis=-1))


def test_parameters_carry_logical_axes():
    attn = _attn()
    specs = nnx.get_partition_spec(nnx.state(attn, nnx.Param))
    assert tuple(specs["w_q"].get_value()) == ("embed", "heads", "head_dim")
    assert tuple(specs["w_o"].get_value()) == ("heads", "head_dim", "embed")


def test_bfloat16_compute():
    with nnx.use_eager_sharding(False):
        attn = Attention(D, H, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(5), (1, 6, D))
    y = _call(attn, x, jnp.ones((1, 6), jnp.int32))
    assert y.dtype == jnp.bfloat16 and attn.w_q[...].dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(y, np.float32)))


def test_bad_shapes_raise():
    attn = _attn()
    with pytest.raises(ValueError, match="does not match"):
        _call(attn, jnp.zeros((1, 4, D)), jnp.ones((1, 5), jnp.int32))
    with pytest.raises(ValueError, match="divisible"):
        Attention(10, 3, rngs=nnx.Rngs(0))


_STEP = nnx.jit(lambda attn, x, stream, state: attn(x, stream, state))


def _stream_calls(attn, x, seg, splits, prefix=None):
    """Run x in consecutive calls cut at ``splits`` with the carried state (after an optional
    persistent call), each call jitted; returns the concatenated outputs."""
    B = x.shape[0]
    state, sstate = attn.init_state(B), fresh_stream_state(B)
    if prefix is not None:
        stream, sstate = make_stream(jnp.full(prefix.shape[:2], P, jnp.int32), sstate, fresh=True)
        _, state = attn(prefix, stream, state)
        sstate = sstate._replace(position=jnp.int32(0))
    outs, bounds = [], [0, *splits, x.shape[1]]
    for a, b in zip(bounds[:-1], bounds[1:]):
        stream, sstate = make_stream(jnp.asarray(seg[:, a:b], jnp.int32), sstate)
        y, state = _STEP(attn, x[:, a:b], stream, state)
        outs.append(y)
    return jnp.concatenate(outs, axis=1), state


CACHE_SEG = np.array([[1] * 7 + [2] * 9 + [0] * 2, [3] * 18])


@pytest.mark.parametrize("kw", [dict(window=4), dict(max_context=6), dict(window=20)])
# cuts inside a document and at the next one's start (6, 7), several across both rows'
# documents (3, 9, 12), and token by token
@pytest.mark.parametrize("splits", [(6, 7), (3, 9, 12), tuple(range(1, 18))])
def test_carried_cache_equals_one_call_float64(kw, splits):
    with jax.enable_x64(True):
        attn = _attn(param_dtype=jnp.float64, dtype=jnp.float64, **kw)
        x = jax.random.normal(jax.random.key(6), (2, 18, D), jnp.float64)
        whole = _call(attn, x, CACHE_SEG)
        got, state = _stream_calls(attn, x, CACHE_SEG, splits)
        np.testing.assert_allclose(got, whole, rtol=0, atol=1e-12)
        C = kw.get("window") or kw["max_context"]
        assert state.recent.k.shape == (2, C, H, D // H)  # constant in the stream's length


def test_max_context_bounds_one_call_like_a_window():
    with jax.enable_x64(True):
        a = _attn(max_context=4, param_dtype=jnp.float64, dtype=jnp.float64)
        b = _attn(window=4, param_dtype=jnp.float64, dtype=jnp.float64)
        x = jax.random.normal(jax.random.key(7), (2, 18, D), jnp.float64)
        np.testing.assert_array_equal(_call(a, x, CACHE_SEG), _call(b, x, CACHE_SEG))


@pytest.mark.parametrize("splits", [(), tuple(range(1, 10))])
def test_persistent_slots_are_never_evicted(splits):
    """A persistent call then the stream equals one window [P P || x] (the old prefix layout)."""
    with jax.enable_x64(True):
        attn = _attn(window=3, n_persistent=2, param_dtype=jnp.float64, dtype=jnp.float64)
        x = jax.random.normal(jax.random.key(8), (1, 12, D), jnp.float64)
        seg = np.array([[P, P] + [1] * 5 + [2] * 5])
        whole = _call(attn, x, seg)
        got, state = _stream_calls(attn, x[:, 2:], seg[:, 2:], splits, prefix=x[:, :2])
        np.testing.assert_allclose(got, whole[:, 2:], rtol=0, atol=1e-12)
        assert bool(np.all(state.persistent.valid)) and state.persistent.k.shape[1] == 2


def test_unbounded_full_attention_cannot_continue_a_stream():
    attn = _attn()
    x = jnp.zeros((1, 3, D))
    stream, _ = make_stream(jnp.ones((1, 3), jnp.int32), fresh_stream_state(1))
    with pytest.raises(ValueError, match="max_context"):
        attn(x, stream, attn.init_state(1))
    assert attn.init_state(1).recent.k.shape[1] == 0


@pytest.mark.parametrize("window", [None, 3])
def test_gradients_match_plain_reference_float64(window):
    """The projections' custom backward (titans_lm.nn.project): gradients with respect to the
    input and the four weights, and a second-order gradient, equal the plain einsum reference's."""
    with jax.enable_x64(True):
        attn = _attn(window, param_dtype=jnp.float64, dtype=jnp.float64)
        graphdef, params, rest = nnx.split(attn, nnx.Param, ...)
        seg = jnp.asarray(SEGS[1], jnp.int32)
        x = jax.random.normal(jax.random.key(7), (2, 12, D), jnp.float64)
        c = jax.random.normal(jax.random.key(8), (2, 12, D), jnp.float64)

        def ours(x, params):
            return jnp.sum(_call(nnx.merge(graphdef, params, rest), x, seg) * c)

        def plain(x, params):
            ws = tuple(params[n][...] for n in ("w_q", "w_k", "w_v", "w_o"))
            return jnp.sum(_plain(x, ws, seg, window, attn.rope_theta) * c)

        assert_same_derivatives(ours, plain, x, params)
