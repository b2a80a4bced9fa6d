"""NeuralMemory layer: causality, documents, ablation switches, meta-gradients, lower-level API."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from titans_lm.memory import memory_read
from titans_lm.memory.config import MemoryConfig
from titans_lm.memory.layer import NeuralMemory
from titans_lm.nn.stream import fresh_stream_state, make_stream

AXIS_NAMES = {"vocab", "embed", "mlp", "heads", "head_dim", "memory", None}


# Tiny programs: skip LLVM's expensive optimisations, compile time dominates these tests.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


@functools.cache
def _make(items):
    base = dict(d_model=12, n_heads=2, head_dim=4, chunk_size=4, memory_expansion=2.0)
    base.update(dict(items))
    return NeuralMemory(MemoryConfig(**base), rngs=nnx.Rngs(0))


def make(**kw):
    """A small layer (cached per configuration; tests must not mutate it)."""
    return _make(tuple(sorted(kw.items())))


def make64(**kw):
    """A float64 layer with livelier gates than the defaults (so every path carries signal)."""
    return make(dtype="float64", param_dtype="float64", theta_max=0.5, alpha_bias_init=-2.0, **kw)


def x_like(layer, B, T, seed=1):
    dt = jnp.dtype(layer.cfg.param_dtype)
    return jax.random.normal(jax.random.key(seed), (B, T, layer.cfg.d_model), dt)


def fresh_stream(seg):
    """The Stream of a window that starts a stream (one call, as in training)."""
    return make_stream(seg, fresh_stream_state(seg.shape[0]), fresh=True)[0]


def call(layer, x, seg):
    """The training path: one call from a fresh state, the new state dropped."""
    return layer(x, fresh_stream(seg), layer.init_state(x.shape[0]))[0]


def project(layer, x, seg):
    return layer.project(x, fresh_stream(seg))[0]


METHODS = {"__call__": call, "project": project}


@functools.cache
def _jitted(layer, method):
    graphdef, state = nnx.split(layer)
    fn = jax.jit(lambda st, x, seg: METHODS[method](nnx.merge(graphdef, st), x, seg),
                 compiler_options=FAST_COMPILE)
    return functools.partial(fn, state)


def jitted(layer, method="__call__"):
    """layer.<method>(x, segment_ids) under jax.jit (eager dispatch compiles op by op: slow)."""
    fn = _jitted(layer, method)
    return lambda x, seg=None: fn(x, jnp.ones(x.shape[:2], jnp.int32) if seg is None else seg)


def test_shapes_dtypes_and_bfloat16():
    layer = make()
    x = x_like(layer, 2, 10)
    y = jitted(layer)(x, jnp.ones((2, 10), jnp.int32))
    assert y.shape == (2, 10, 12) and y.dtype == jnp.float32 and np.all(np.isfinite(y))
    y16 = jitted(make(dtype="bfloat16"))(x)   # same seed: the same parameters
    assert y16.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(y16, np.float32), y, atol=0.1)
    with pytest.raises(ValueError, match="x_BTD must be"):
        call(layer, x[..., :5], jnp.ones((2, 10), jnp.int32))
    with pytest.raises(ValueError, match="the stream is for calls of shape"):
        call(layer, x, jnp.ones((2, 9), jnp.int32))


def test_parameters_carry_logical_axis_names():
    layer = make()
    params = nnx.state(layer, nnx.Param)
    for path, var in jax.tree_util.tree_flatten_with_path(
            params, is_leaf=lambda v: isinstance(v, nnx.Variable))[0]:
        names = var.get_metadata().get("out_sharding")
        assert names is not None and len(names) == var[...].ndim, path
        assert set(names) <= AXIS_NAMES, (path, names)
    assert params["w_q"].get_metadata()["out_sharding"] == ("embed", "heads", "head_dim")
    assert params["w_out"].get_metadata()["out_sharding"] == ("heads", "head_dim", "embed")


@pytest.mark.parametrize("settings", [dict(gate_granularity="token"),
                                      dict(gate_granularity="chunk"),
                                      dict(ns_steps=5),
                                      dict(omega_window=6)],   # Atlas' Omega rule, across chunks
                         ids=["token", "chunk", "newton_schulz", "omega"])
def test_causality_exact_including_inside_a_chunk(settings):
    with jax.enable_x64(True):
        layer = make64(**settings)
        fn = jitted(layer)
        x = x_like(layer, 1, 24)
        y = fn(x)
        for j in (4, 6, 13):   # a chunk start, inside chunk 1, inside chunk 3
            y2 = fn(x.at[0, j].add(1.0))
            np.testing.assert_array_equal(np.asarray(y2[0, :j]), np.asarray(y[0, :j]))
            assert float(jnp.max(jnp.abs(y2[0, j:] - y[0, j:]))) > 1e-6


@pytest.mark.parametrize("settings", [{}, dict(ns_steps=5), dict(omega_window=6)],
                         ids=["plain", "newton_schulz", "omega"])
def test_packed_documents_equal_each_document_alone(settings):
    """(omega: Atlas' Omega windows of 6 tokens stop at a document start, even one that a
    window would reach across a chunk start and padding.)"""
    with jax.enable_x64(True):
        layer = make64(**settings)
        fn = jitted(layer)
        x = x_like(layer, 1, 24, seed=2)
        # doc 1 (6 tokens) + 2 padding tokens, doc 2 from position 8, doc 3 from position 20.
        seg = jnp.array([[1] * 6 + [0] * 2 + [2] * 12 + [3] * 4])
        y = fn(x, seg)
        assert np.all(np.isfinite(np.asarray(y)))
        for start, stop in ((0, 6), (8, 20), (20, 24)):
            # The document alone: at the start of a window, followed by padding only.
            alone = jnp.zeros_like(x).at[:, :stop - start].set(x[:, start:stop])
            seg_alone = jnp.zeros_like(seg).at[:, :stop - start].set(1)
            np.testing.assert_allclose(y[:, start:stop], fn(alone, seg_alone)[:, :stop - start],
                                       atol=1e-12)
        inputs = jitted(layer, "project")(x, seg)
        for g in (inputs.theta, inputs.eta, inputs.alpha):
            assert np.all(np.asarray(g[:, :, 6:8]) == 0)  # padding writes nothing
        assert np.asarray(inputs.reset[0]).nonzero()[0].tolist() == [0, 8, 20]


def test_ablation_switches():
    base = make()
    no_decay = make(use_decay=False)
    no_momentum = make(use_momentum=False)
    no_conv = make(use_conv=False)
    x = x_like(base, 2, 10)
    inputs = jitted(no_decay, "project")(x)
    assert np.all(np.asarray(inputs.alpha) == 0) and not hasattr(no_decay, "alpha_w")
    assert np.all(np.asarray(inputs.eta) > 0)
    inputs = jitted(no_momentum, "project")(x)
    assert np.all(np.asarray(inputs.eta) == 0) and not hasattr(no_momentum, "eta_w")
    names = lambda m: set(nnx.state(m, nnx.Param).keys())  # noqa: E731
    assert {"conv_q", "conv_k", "conv_v"} <= names(base)
    assert not {"conv_q", "conv_k", "conv_v"} & names(no_conv)
    th = jitted(base, "project")(x).theta
    assert np.all((np.asarray(th) > 0) & (np.asarray(th) < base.cfg.theta_max))
    assert [p.shape for p in make(memory_depth=1).w0] == [(2, 4, 4)]
    deep = make(memory_depth=3)
    assert [p.shape for p in deep.w0] == [(2, 4, 8), (2, 8, 8), (2, 8, 4)]
    ttt = make(memory_depth=1, memory_residual_ln=True, gate_style="ttt", use_momentum=False,
               use_decay=False, ttt_base_lr=1.0)
    assert [p.shape for p in ttt.w0] == [(2, 4, 4), (2, 4), (2, 4)]
    th = np.asarray(jitted(ttt, "project")(x).theta)
    assert np.all((th > 0) & (th < 1.0 / 4))
    for layer in (ttt, deep):
        assert np.all(np.isfinite(np.asarray(jitted(layer)(x))))


def test_meta_gradients_through_projection_parameters_match_finite_differences():
    with jax.enable_x64(True):
        layer = make64(memory_bias=True)
        graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
        x = x_like(layer, 1, 10)
        seg = jnp.array([[1] * 8 + [2] * 2])
        weights = jax.random.normal(jax.random.key(7), (1, 10, 12), jnp.float64)
        loss = lambda p: jnp.sum(call(nnx.merge(graphdef, p, rest), x, seg) * weights)  # noqa: E731
        f = jax.jit(loss, compiler_options=FAST_COMPILE)
        grads = jax.jit(jax.grad(loss), compiler_options=FAST_COMPILE)(params)
        rng = np.random.default_rng(0)
        names = ["w_q", "w_k", "w_v", "conv_q", "conv_k", "conv_v", "theta_w", "theta_b", "eta_w",
                 "alpha_w", "w0"]
        for name in names:
            sub = params[name]
            direction = jax.tree.map(lambda a: jnp.asarray(rng.normal(size=a.shape)), sub)
            analytic = sum(float(jnp.sum(g * u)) for g, u in
                           zip(jax.tree.leaves(grads[name]), jax.tree.leaves(direction)))

            def shifted(s):
                new = jax.tree.map(lambda a: a, params)
                new[name] = jax.tree.map(lambda a, u: a + s * u, sub, direction)
                return new

            h = 1e-5
            numeric = (float(f(shifted(h))) - float(f(shifted(-h)))) / (2 * h)
            assert abs(analytic) > 1e-7, f"{name}: vanishing derivative, test would be vacuous"
            assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-9), name


def _lower_level_pieces(layer, x, seg):
    """Everything the lower-level API test looks at, computed in one jitted program."""
    graphdef, st = nnx.split(layer)

    def pieces(st, x, seg):
        m = nnx.merge(graphdef, st)
        out = {"call": call(m, x, seg)}
        inp = project(m, x, seg)
        s0 = m.init_state(x.shape[0])
        state = (s0.params, s0.momentum)
        reads, final = m.scan(state, *inp)
        out.update(inputs=inp, state=state, reads=reads, final=final, composed=m.output(reads, x))
        seg_reads, state_n = [], state   # a MAC-style loop over segments of 8 tokens
        for s in range(x.shape[1] // 8):
            sl = slice(8 * s, 8 * s + 8)
            r, state_n = m.scan(state_n, inp.q[:, :, sl], inp.k[:, :, sl], inp.v[:, :, sl],
                                inp.theta[:, :, sl], inp.eta[:, :, sl], inp.alpha[:, :, sl],
                                inp.reset[:, sl])
            seg_reads.append(r)
        out.update(seg_reads=jnp.concatenate(seg_reads, axis=2), seg_final=state_n)
        # reset_to: a document start restores the given parameters instead of W0.
        target = jax.tree.map(lambda p: p + 0.5, state[0])
        out.update(reset_to=m.scan(state, *inp, reset_to=target)[0],
                   from_target=m.scan((target, state[1]), *inp[:6], inp.reset.at[:, 0].set(False),
                                      reset_to=target)[0],
                   second_doc_from_target=m.scan(jax.tree.map(lambda a: a[1:], (target, state[1])),
                                                 *(a[1:, :, 8:] for a in inp[:6]))[0])
        out.update(read_final=m.read(final, inp.q),
                   start_reads=m.scan(state, *inp, read="chunk_start")[0],
                   read_initial=m.read(state, inp.q[:, :, :4]),
                   restarted=m.reset_memory(s0._replace(params=final[0], momentum=final[1]),
                                            jnp.array([True, False])))
        return out

    return jax.jit(pieces, compiler_options=FAST_COMPILE)(st, x, seg)


def test_lower_level_api_composes_to_the_call_and_to_a_segment_loop():
    with jax.enable_x64(True):
        layer = make64()
        x = x_like(layer, 2, 16)
        seg = jnp.array([[1] * 16, [1] * 8 + [2] * 8])
        o = _lower_level_pieces(layer, x, seg)
        inp = o["inputs"]
        assert inp.q.shape == (2, 2, 16, 4) and inp.theta.shape == (2, 2, 16) and inp.reset.shape == (2, 16)
        np.testing.assert_allclose(o["composed"], o["call"], atol=1e-13)
        np.testing.assert_allclose(o["seg_reads"], o["reads"], atol=1e-13)
        for a, b in zip(jax.tree.leaves(o["seg_final"]), jax.tree.leaves(o["final"])):
            np.testing.assert_allclose(a, b, atol=1e-13)
        np.testing.assert_allclose(o["reset_to"][1:, :, 8:], o["second_doc_from_target"], atol=1e-13)
        # (position 0 is a document start too: both rows begin from the target)
        np.testing.assert_allclose(o["reset_to"], o["from_target"], atol=1e-13)
        assert float(jnp.max(jnp.abs(o["reset_to"] - o["reads"]))) > 1e-3
        # read: retrieval without writing.
        want = memory_read(tuple(p[1, 0] for p in o["final"][0]), inp.q[1, 0], layer.model)
        np.testing.assert_allclose(o["read_final"][1, 0], want, atol=1e-14)
        # chunk_start reads of the first chunk come from the initial state.
        np.testing.assert_allclose(o["start_reads"][:, :, :4], o["read_initial"], atol=1e-14)
        restarted = o["restarted"]   # row 0 back to W0 with zero momentum, row 1 kept
        for a, b, c in zip(restarted.params, o["state"][0], o["final"][0]):
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], c[1])
        for a, c in zip(restarted.momentum, o["final"][1]):
            assert not np.asarray(a[0]).any()
            np.testing.assert_array_equal(a[1], c[1])
        assert not np.asarray(restarted.buf_real[0]).any()


def test_config_switch_impl_reference_matches_chunked():
    with jax.enable_x64(True):
        layer = make64()
        ref = make64(impl="reference")
        x = x_like(layer, 1, 24)
        np.testing.assert_allclose(jitted(ref)(x), jitted(layer)(x), atol=1e-12)
        assert dataclasses.replace(layer.cfg, impl="reference") == ref.cfg
