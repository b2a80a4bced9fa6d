"""NeuralMemory's carried state: any split of a sequence into calls equals one call (float64)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from titans_lm.memory.config import MemoryConfig
from titans_lm.memory.carried import MemoryState
from titans_lm.memory.layer import NeuralMemory
from titans_lm.nn.segments import PERSISTENT_SEGMENT_ID
from titans_lm.nn.stream import fresh_stream_state, make_stream

FAST_COMPILE = {"xla_backend_optimization_level": 0}
T = 14
# Documents start at 0, 4 and 12 (chunk starts for chunk_size 4), padding at 8..9, a document start
# inside a chunk at 10 (ignored by the memory, as in one call), so both halves of most splits hold
# a document boundary.
SEG = np.array([[1] * 4 + [2] * 4 + [0] * 2 + [3] * 2 + [4] * 2,
                [5] * 6 + [6] * 8], np.int32)

CONFIGS = {
    "titans_mlp": dict(memory_depth=2, use_momentum=True, use_decay=True, use_conv=True),
    "titans_linear": dict(memory_depth=1, use_momentum=True, use_decay=True, use_conv=True),
    "ttt_linear": dict(memory_depth=1, gate_style="ttt", use_momentum=False, use_decay=False,
                       use_conv=False, memory_residual_ln=True),
    "chunk_gates": dict(memory_depth=2, gate_granularity="chunk", use_conv=True),
    # Atlas' polynomial keys (the carried buffers keep head_dim) under MIRAS' l_p bias
    "poly_lp": dict(memory_depth=2, feature_map="poly", feature_degree=2, attentional_bias="lp",
                    bias_p=3.0),
    # the forget gate decays toward the state documents start from
    "decay_to_initial": dict(memory_depth=2, decay_target="initial"),
    # Atlas' Muon rule: Newton-Schulz steps on the momentum (materialised chunk states)
    "newton_schulz": dict(memory_depth=2, ns_steps=5),
    # LaCT: SwiGLU fast weights, the dot bias, chunk-start reads, the weight norm at chunk ends
    "lact": dict(memory_depth=2, memory_activation="swiglu", attentional_bias="dot",
                 use_momentum=False, use_decay=False, fast_weight_norm=True, read="chunk_start",
                 use_conv=False),
    # Atlas' Omega rule, a window of 6 > the chunk of 4: it reaches across chunks and calls
    "omega": dict(memory_depth=2, omega_window=6),
}


@functools.cache
def _make(name):
    cfg = MemoryConfig(d_model=12, n_heads=2, head_dim=4, chunk_size=4, memory_expansion=2.0,
                       dtype="float64", param_dtype="float64", theta_max=0.5, alpha_bias_init=-2.0,
                       **CONFIGS[name])
    return NeuralMemory(cfg, rngs=nnx.Rngs(0))   # no use_eager_sharding context needed


@functools.cache
def _step(name):
    graphdef, params = nnx.split(_make(name))
    fn = jax.jit(lambda p, x, stream, state: nnx.merge(graphdef, p)(x, stream, state),
                 compiler_options=FAST_COMPILE)
    return functools.partial(fn, params)


def x_input(seed=1):
    return jax.random.normal(jax.random.key(seed), (2, T, 12), jnp.float64)


def run(name, x, seg, cuts, *, first_fresh=True, stream_state=None, state=None):
    """The calls over x[:, cuts[i]:cuts[i + 1]] with the state carried; outputs concatenated."""
    layer, step = _make(name), _step(name)
    B = x.shape[0]
    stream_state = fresh_stream_state(B) if stream_state is None else stream_state
    state = layer.init_state(B) if state is None else state
    ys = []
    for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        stream, stream_state = make_stream(jnp.asarray(seg[:, a:b]), stream_state,
                                           fresh=first_fresh and i == 0)
        y, state = step(x[:, a:b], stream, state)
        ys.append(y)
    return jnp.concatenate(ys, axis=1), state


def max_diff(a, b):
    return float(jnp.max(jnp.abs(a - b)))


def check_splits(name, splits):
    with jax.enable_x64(True):
        x = x_input()
        whole, end = run(name, x, SEG, [0, T])
        for s in splits:
            y, state = run(name, x, SEG, [0, s, T])
            assert max_diff(y, whole) < 1e-12, f"split {s}: {max_diff(y, whole):.2e}"
            for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(end)):
                np.testing.assert_allclose(got, want, atol=1e-12, err_msg=f"split {s}")


# The rules split one token per call (every split point, inside and across chunks and windows).
TOKEN_BY_TOKEN = ("titans_mlp", "ttt_linear", "chunk_gates", "newton_schulz", "omega")


@pytest.mark.parametrize("name", [name for name in CONFIGS if name not in TOKEN_BY_TOKEN])
def test_two_calls_equal_one_call(name):
    """The other rules: a split inside a chunk (each call length compiles once, so the splits
    are few; the strided calls below and one token per call cover every chunk phase)."""
    check_splits(name, (5,))


def test_strided_calls_equal_one_call():
    """Calls of 3 tokens, a length coprime to the chunk of 4: the calls start at every chunk
    phase, cross chunk starts, documents and padding, with the state carried throughout."""
    with jax.enable_x64(True):
        x = x_input()
        whole, end = run("titans_mlp", x, SEG, [0, T])
        y, state = run("titans_mlp", x, SEG, [*range(0, T, 3), T])
        assert max_diff(y, whole) < 1e-12, max_diff(y, whole)
        for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(end)):
            np.testing.assert_allclose(got, want, atol=1e-12)


@pytest.mark.parametrize("name", TOKEN_BY_TOKEN)
def test_token_by_token_equals_one_call(name):
    with jax.enable_x64(True):
        x = x_input(2)
        whole, end = run(name, x, SEG, [0, T])
        y, state = run(name, x, SEG, list(range(T + 1)))
        assert max_diff(y, whole) < 1e-12, max_diff(y, whole)
        for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(end)):
            np.testing.assert_allclose(got, want, atol=1e-12)
        # Three calls with uneven lengths, the first one not fresh (a promise not made).
        y3, _ = run(name, x, SEG, [0, 5, 6, T], first_fresh=False)
        assert max_diff(y3, whole) < 1e-12


def test_a_continued_call_does_not_reset_at_its_first_token():
    with jax.enable_x64(True):
        x = x_input(3)
        seg = np.ones((2, T), np.int32)
        whole, _ = run("titans_mlp", x, seg, [0, T])
        split, _ = run("titans_mlp", x, seg, [0, 8, T])      # token 8 starts a chunk
        assert max_diff(split, whole) < 1e-12
        # A new document at the call boundary does reset: the second half equals it alone.
        seg2 = seg.copy()
        seg2[:, 8:] = 2
        joined, _ = run("titans_mlp", x, seg2, [0, 8, T])
        alone, _ = run("titans_mlp", x[:, 8:], seg2[:, 8:], [0, T - 8])
        assert max_diff(joined[:, 8:], alone) < 1e-12
        assert max_diff(joined[:, 8:], split[:, 8:]) > 1e-3


def test_outputs_are_causal_across_calls():
    with jax.enable_x64(True):
        x = x_input(4)
        seg = np.ones((2, T), np.int32)
        y, _ = run("titans_mlp", x, seg, [0, 6, T])
        y2, _ = run("titans_mlp", x.at[:, 9:].add(1.0), seg, [0, 6, T])
        assert max_diff(y[:, :9], y2[:, :9]) == 0.0
        assert max_diff(y[:, 9:], y2[:, 9:]) > 1e-3


@pytest.mark.parametrize("n_prefix", [3, 4])
def test_a_persistent_pass_sets_the_state_documents_start_from(n_prefix):
    """Persistent tokens first (their own call, as LanguageModel.init_state runs them), then the
    real tokens on a chunk grid of their own, every document restarting from the prefix's state:
    the engine run by hand (prefix from W0, then the tokens from its state)."""
    name = "titans_mlp"
    with jax.enable_x64(True):   # _make is cached: whichever test builds it first, float64 holds
        layer = _make(name)
        B = 2
        p = jax.random.normal(jax.random.key(7), (B, n_prefix, 12), jnp.float64)
        seg_p = np.full((B, n_prefix), PERSISTENT_SEGMENT_ID, np.int32)
        y_p, state = run(name, p, seg_p, [0, n_prefix])
        stream_state = make_stream(jnp.asarray(seg_p), fresh_stream_state(B))[1]
        stream_state = stream_state._replace(position=jnp.zeros((), jnp.int32))
        x = x_input(5)
        y, _ = run(name, x, SEG, [0, T], stream_state=stream_state, state=state)
        y_split, _ = run(name, x, SEG, [0, 5, 7, T], stream_state=stream_state, state=state)
        assert max_diff(y_split, y) < 1e-12
        # By hand.
        reads_p, reads, reads_w0 = _by_hand(layer, p, x, jnp.asarray(seg_p), stream_state)
        assert max_diff(y_p, layer.output(reads_p, p)) < 1e-12
        assert max_diff(y, layer.output(reads, x)) < 1e-12
        # Documents restart from the prefix state, not from W0.
        assert max_diff(reads, reads_w0) > 1e-3


@nnx.jit
def _by_hand(layer, p, x, seg_p, stream_state):
    """The prefix scanned from W0, then the tokens from its state (reset target: that state),
    and for contrast with the reset target W0."""
    B = p.shape[0]
    sp, _ = make_stream(seg_p, fresh_stream_state(B), fresh=True)
    ins_p, _ = layer.project(p, sp)
    s0 = layer.init_state(B)
    reads_p, state_p = layer.scan((s0.params, s0.momentum), ins_p.q, ins_p.k, ins_p.v, ins_p.theta,
                                  ins_p.eta, ins_p.alpha, ins_p.reset)
    sx, _ = make_stream(jnp.asarray(SEG), stream_state, fresh=True)
    ins, _ = layer.project(x, sx)
    reads, _ = layer.scan(state_p, ins.q, ins.k, ins.v, ins.theta, ins.eta, ins.alpha,
                          ins.reset, reset_to=state_p[0])
    reads_w0, _ = layer.scan(state_p, ins.q, ins.k, ins.v, ins.theta, ins.eta, ins.alpha,
                             ins.reset)
    return reads_p, reads, reads_w0


def test_gradients_of_split_calls_equal_those_of_one_call():
    name = "titans_mlp"
    with jax.enable_x64(True):   # _make is cached: built first here, its float64 must hold
        layer = _make(name)
        x = x_input(6)
        graphdef, params = nnx.split(layer)

        def loss(params, cuts):
            model = nnx.merge(graphdef, params)
            st, ms, total = fresh_stream_state(2), model.init_state(2), 0.0
            for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
                stream, st = make_stream(jnp.asarray(SEG[:, a:b]), st, fresh=i == 0)
                y, ms = model(x[:, a:b], stream, ms)
                total = total + jnp.sum(jnp.sin(y))
            return total

        g1 = jax.jit(jax.grad(lambda p: loss(p, [0, T])), compiler_options=FAST_COMPILE)(params)
        g2 = jax.jit(jax.grad(lambda p: loss(p, [0, 5, T])), compiler_options=FAST_COMPILE)(params)
        for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
            scale = max(1.0, float(jnp.max(jnp.abs(a))))
            assert float(jnp.max(jnp.abs(a - b))) < 1e-10 * scale


def test_state_is_a_pytree_of_fixed_shapes():
    with jax.enable_x64(True):
        layer = _make("titans_mlp")
        state = layer.init_state(3)
        assert isinstance(state, MemoryState)
        assert state.buf_k.shape == (3, 2, 3, 4) and state.n_buf.shape == ()
        assert [t.shape for t in state.conv_tail] == [(3, 3, 2, 4)] * 3
        x = jax.random.normal(jax.random.key(0), (3, 5, 12), jnp.float64)
        stream, _ = make_stream(jnp.ones((3, 5), jnp.int32), fresh_stream_state(3), fresh=True)
        _, new = _step("titans_mlp")(x, stream, state)
    assert jax.tree.map(jnp.shape, new) == jax.tree.map(jnp.shape, state)
    assert int(new.n_buf) == 1
    with pytest.raises(ValueError, match="batch_size"):
        layer.init_state(0)
    with pytest.raises(ValueError, match="the stream is for calls of shape"):
        layer(x[:, :4], stream, state)
