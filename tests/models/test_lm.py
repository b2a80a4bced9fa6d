"""The LM shell with a non-attention token mixer (a document-resetting short conv), as later
backbones plug in their own mixers, plus the persistent-memory prefix."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from titans_lm.models.lm import LanguageModel, LMState, count_params
from titans_lm.nn.attention import Attention
from titans_lm.nn.conv import ShortConv

D, V = 16, 32


class _ConvMixer(nnx.Module):
    """A document-resetting short conv as a token mixer of one fresh call (no carried state)."""

    def __init__(self, rngs):
        self.conv = ShortConv(D, kernel_size=3, rngs=rngs)

    def init_state(self, batch_size):
        return ()

    def __call__(self, x, stream, state):
        return self.conv(x, stream.segment_ids), state


def _lm(make_mixer, **kw):
    with nnx.use_eager_sharding(False):
        return LanguageModel(vocab_size=V, d_model=D, n_layers=2, d_ff=32, make_mixer=make_mixer,
                             init_std=0.3, rngs=nnx.Rngs(0), **kw)


def _jit(m):
    gdef, state = nnx.split(m)
    f = jax.jit(lambda st, t, s: nnx.merge(gdef, st)(t, s))
    return lambda t, s: f(state, t, s)


def test_conv_mixer_lm_is_causal_and_document_local():
    m = _lm(lambda i, rngs: _ConvMixer(rngs))
    fwd = _jit(m)
    tok = jax.random.randint(jax.random.key(0), (1, 12), 4, V)
    seg = jnp.asarray([[1] * 6 + [2] * 6], jnp.int32)
    base = fwd(tok, seg)
    assert base.shape == (1, 12, V) and base.dtype == jnp.float32
    # receptive field of 2 conv layers with 3 taps: tokens t-4..t, never across the boundary
    out = fwd(tok.at[0, 2].set(7), seg)
    changed = np.any(np.asarray(out != base), axis=-1)[0]
    np.testing.assert_array_equal(changed, [2 <= t <= 5 for t in range(12)])


def test_persistent_prefix_is_used():
    make = lambda i, rngs: Attention(D, 2, init_std=0.3, n_persistent=3, rngs=rngs)
    m0, m3 = _lm(make), _lm(make, n_persistent=3)
    assert count_params(m3) - count_params(m0) == 3 * D
    tok = jax.random.randint(jax.random.key(1), (2, 8), 4, V)
    seg = jnp.ones_like(tok)
    fwd = _jit(m3)
    base = fwd(tok, seg)
    assert base.shape == (2, 8, V)
    m3.persistent.tokens[...] = m3.persistent.tokens[...] + 1.0
    assert np.all(np.any(np.asarray(_jit(m3)(tok, seg) != base), axis=-1))


def test_invalid_arguments_raise():
    with pytest.raises(ValueError, match="remat"):
        _lm(lambda i, rngs: _ConvMixer(rngs), remat="all")
    with pytest.raises(ValueError, match="n_layers"):
        LanguageModel(vocab_size=V, d_model=D, n_layers=0, d_ff=8,
                      make_mixer=lambda i, rngs: None, rngs=nnx.Rngs(0))


def test_stateful_call_from_init_state_equals_the_training_call():
    make = lambda i, rngs: Attention(D, 2, init_std=0.3, window=4, n_persistent=2, rngs=rngs)
    m = _lm(make, n_persistent=2)
    tok = jax.random.randint(jax.random.key(2), (2, 10), 4, V)
    seg = jnp.asarray([[1] * 6 + [2] * 4, [3] * 10], jnp.int32)
    state = m.init_state(2)
    assert isinstance(state, LMState) and len(state.layers) == 2
    assert int(state.stream.position) == 0  # the prefix does not advance the stream
    logits, new_state = m(tok, seg, state)
    np.testing.assert_allclose(logits, m(tok, seg), rtol=1e-6, atol=1e-6)
    assert int(new_state.stream.position) == 10
    # the state is a pytree of arrays of fixed shapes: a second call jit-compiles against it
    second, _ = nnx.jit(lambda mm, t, s, st: mm(t, s, st))(m, tok, seg, new_state)
    assert second.shape == (2, 10, V)
    with pytest.raises(ValueError, match="batch size"):
        m(tok, seg, m.init_state(3))


def test_the_initial_state_is_marked_fresh_and_continued_drops_the_mark():
    """``init_state`` marks its state fresh (static, part of the pytree structure): the call
    from it runs the single-sequence program; ``continued()`` gives the same arrays without the
    mark, the structure every later state has, and the same results."""
    make = lambda i, rngs: Attention(D, 2, init_std=0.3, window=4, n_persistent=2, rngs=rngs)
    m = _lm(make, n_persistent=2)
    tok = jax.random.randint(jax.random.key(2), (2, 10), 4, V)
    seg = jnp.asarray([[1] * 6 + [2] * 4, [3] * 10], jnp.int32)
    state = m.init_state(2)
    assert state.fresh and not state.continued().fresh
    logits, new_state = m(tok, seg, state)
    logits_c, new_state_c = m(tok, seg, state.continued())
    assert not new_state.fresh
    assert jax.tree.structure(new_state) == jax.tree.structure(state.continued())
    assert jax.tree.structure(state) != jax.tree.structure(state.continued())
    np.testing.assert_allclose(logits_c, logits, rtol=1e-6, atol=1e-6)
    for a, b in zip(jax.tree.leaves(new_state), jax.tree.leaves(new_state_c)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_every_backbone_mixer_satisfies_the_mixer_protocol():
    from _backbones import BACKBONES, build, small_model_cfg
    from titans_lm.models.mixer import Mixer
    for name in BACKBONES + ("transformer",):   # traced only (shapes): the protocol is structure
        model = nnx.eval_shape(lambda: build(small_model_cfg(name, "float32")))
        kinds = {type(b.mixer).__name__ for b in model.blocks}
        assert all(isinstance(b.mixer, Mixer) for b in model.blocks), (name, kinds)
        state = nnx.eval_shape(lambda m: m.init_state(2), model)
        n_mem = len(nnx.eval_shape(lambda m, s: m.memory_norms(s), model, state))
        assert n_mem == (0 if name == "transformer" else 2), (name, n_mem)
        same = nnx.eval_shape(lambda m, s: m.reset_memory(s, jnp.array([True, False])), model,
                              state)
        assert jax.tree.structure(same) == jax.tree.structure(state)
