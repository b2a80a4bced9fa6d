"""Titans MAC backbone: segment-wise retrieval, attention over [persistent || h || segment], write
with the attention output (the paper) or the segment input (the configs' default), read after each
token's own write; the ablation switch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from _backbones import build, load_config, run_probe, small_model_cfg
from titans_lm.models.mac import MACMixer, SegmentAttentionMixer
from titans_lm.nn.context_attention import ContextAttention

N = 32  # segment length of the test configs


def test_mac_layers():
    """(Causality and documents at every offset in a segment: tests/models/test_documents.py.)"""
    model = build(small_model_cfg("mac", "float32"))
    assert [type(b.mixer) for b in model.blocks] == [MACMixer, MACMixer]


def test_document_starting_inside_a_segment_is_isolated():
    """Segments of 48 (the last one padded): the second document starts inside a segment. It
    never sees the first (retrieval from W0, memory reset, attention mask), but its segments are
    cut differently than when it stands alone, so only isolation and causality hold exactly."""
    model = run_probe("mac", alone_equal=False, segment_len=48, memory_layers="1")
    assert [type(b.mixer) for b in model.blocks] == [SegmentAttentionMixer, MACMixer]


def _mixer(dtype="float64", **changes):
    model = build(small_model_cfg("mac", dtype, n_layers=1, **changes))
    return model.blocks[0].mixer


def _collect(mixer, x, ids):
    """One training-path call (fresh state) with the per-segment internals."""
    from titans_lm.nn.stream import fresh_stream_state, make_stream
    stream, _ = make_stream(ids, fresh_stream_state(x.shape[0]), fresh=True)
    o, _, aux = mixer.forward(x, stream, mixer.init_state(x.shape[0]), collect=True)
    return o, aux


_COLLECT = nnx.jit(_collect)


def test_retrieval_for_segment_n_depends_only_on_earlier_segments():
    with jax.enable_x64(True):
        mixer = _mixer()
        x = jax.random.normal(jax.random.key(0), (1, 128, 32), jnp.float64)
        ids = jnp.ones((1, 128), jnp.int32)
        _, base = _COLLECT(mixer, x, ids)
        n, j = 2, 2 * N + 6  # a token inside segment 2
        _, aux = _COLLECT(mixer, x.at[:, j].add(1.0), ids)
        for s in range(n + 1):  # the states entering segments 0..n never see segment n
            for a, b in zip(jax.tree.leaves(aux["state_in"]), jax.tree.leaves(base["state_in"])):
                np.testing.assert_array_equal(a[s], b[s])
        np.testing.assert_array_equal(aux["h_reads"][:n], base["h_reads"][:n])
        np.testing.assert_array_equal(aux["h_reads"][n][..., :j - n * N, :],
                                      base["h_reads"][n][..., :j - n * N, :])
        params_in = lambda a: a["state_in"][0]  # noqa: E731
        assert max(float(jnp.abs(a[n + 1] - b[n + 1]).max())
                   for a, b in zip(params_in(aux), params_in(base))) > 1e-8  # segment n+1 does
        _, aux = _COLLECT(mixer, x.at[:, N + 3].add(1.0), ids)  # a token of segment 1
        assert max(float(jnp.abs(a[n] - b[n]).max())
                   for a, b in zip(params_in(aux), params_in(base))) > 1e-8


def test_read_after_own_write():
    """The paper's wiring: M*(y_t) equals the read at t of the engine writing the segment's y into
    the state left by the earlier segments, at every t of the segment (the engine's read at t
    follows the writes of 1..t only: its causality, tests/memory/test_layer.py)."""
    with jax.enable_x64(True):
        mixer = _mixer(memory__use_conv=False, memory_input="attention_output")
        mem = mixer.memory
        x = jax.random.normal(jax.random.key(1), (1, 128, 32), jnp.float64)
        ids = jnp.ones((1, 128), jnp.int32)
        _, aux = _COLLECT(mixer, x, ids)
        n = 2
        state = jax.tree.map(lambda a: a[n], aux["state_in"])
        y = aux["y"][n]
        stream, _ = make_stream(ids[:, :N], fresh_stream_state(1), fresh=True)
        w, _ = mem.project(y, stream)  # eta bounded by the layer (eta_max)
        reads, _ = mem.scan(state, w.q, w.k, w.v, w.theta, w.eta, w.alpha, None)
        assert reads.shape[2] == N
        np.testing.assert_allclose(reads, aux["m_reads"][n], rtol=1e-10, atol=1e-12)


def test_segment_input_writes_and_reads_the_segment_input():
    """memory_input="segment_input": M*(x_t) after writing exactly x_1..x_t of the segment."""
    with jax.enable_x64(True):
        mixer = _mixer(memory__use_conv=False, memory_input="segment_input")
        mem = mixer.memory
        x = jax.random.normal(jax.random.key(1), (1, 128, 32), jnp.float64)
        ids = jnp.ones((1, 128), jnp.int32)
        _, aux = _COLLECT(mixer, x, ids)
        n, t = 2, 21
        state = jax.tree.map(lambda a: a[n], aux["state_in"])
        from titans_lm.nn.stream import fresh_stream_state, make_stream
        stream, _ = make_stream(ids[:, :t + 1], fresh_stream_state(1), fresh=True)
        w, _ = mem.project(x[:, n * N:n * N + t + 1], stream)
        reads, _ = mem.scan(state, w.q, w.k, w.v, w.theta, w.eta, w.alpha, None)
        np.testing.assert_allclose(reads[:, :, t], aux["m_reads"][n][:, :, t], rtol=1e-10,
                                   atol=1e-12)


def test_the_sum_combine_adds_the_branches():
    """combine="sum": o = y + M*(x) read through the memory's output head, segment by segment,
    with no parameters of its own; with the gated read ablated, o = y."""
    with jax.enable_x64(True):
        mixer = _mixer(combine="sum", memory_input="segment_input")
        x = jax.random.normal(jax.random.key(4), (1, 96, 32), jnp.float64)
        ids = jnp.ones((1, 96), jnp.int32)
        o, aux = _COLLECT(mixer, x, ids)
        output = nnx.jit(lambda mem, r, src: mem.output(r, src))
        for n in range(3):
            seg = slice(n * N, (n + 1) * N)
            want = aux["y"][n] + output(mixer.memory, aux["m_reads"][n], x[:, seg])
            np.testing.assert_allclose(o[:, seg], want, rtol=1e-10, atol=1e-12)
        assert not nnx.to_pure_dict(nnx.state(mixer.combine, nnx.Param))
        ablated = _mixer(combine="sum", memory_input="segment_input", memory_ablation="gated_read")
        o, aux = _COLLECT(ablated, x, ids)
        np.testing.assert_allclose(o, jnp.moveaxis(aux["y"], 0, 1).reshape(o.shape), rtol=1e-12)


def test_ablating_both_paths_cuts_the_earlier_segments_off():
    """memory_ablation="both": a segment's output no longer depends on earlier segments (they
    reach it only through the memory); "retrieval" alone keeps the gated read's dependence."""
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.key(2), (1, 128, 32), jnp.float64)
        ids = jnp.ones((1, 128), jnp.int32)
        moved = x.at[:, 3].add(1.0)   # a token of segment 0
        for ablation, depends in (("both", False), ("retrieval", True), ("gated_read", True)):
            mixer = _mixer(memory_ablation=ablation)
            diff = float(jnp.abs(_COLLECT(mixer, x, ids)[0][:, N:]
                                 - _COLLECT(mixer, moved, ids)[0][:, N:]).max())
            assert (diff > 1e-8) == depends, (ablation, diff)


def test_config_fields_and_errors():
    cfg = load_config("mac").model
    assert cfg.segment_len == 64 and cfg.n_persistent == 4 and cfg.memory_layers == "all"
    paper = load_config("mac", "760m")
    assert paper.model.segment_len == paper.data.doc_align == 512  # documents start on segments
    mixer = _mixer("float32")
    assert isinstance(mixer.attention, ContextAttention)
    assert mixer.attention.persistent[...].shape == (3, 32)  # persistent tokens per MAC layer
    assert _mixer("float32", n_persistent=0).attention.persistent is None
    with pytest.raises(ValueError, match="multiple of model.memory.chunk_size"):
        build(small_model_cfg("mac", "float32", segment_len=24))
    assert cfg.memory_input == "segment_input" and cfg.memory_ablation == "none"
    assert cfg.combine == "sum"   # a deviation, as MAG's (configs/mac.py)
    with pytest.raises(ValueError, match="model.combine"):
        build(small_model_cfg("mac", "float32", combine="product"))
    with pytest.raises(ValueError, match="memory_input"):
        build(small_model_cfg("mac", "float32", memory_input="x"))
    with pytest.raises(ValueError, match="MAC does not take model.memory.omega_window"):
        build(small_model_cfg("mac", "float32", memory__omega_window=4))


def test_tiny_config_memory_stays_finite_at_initialisation():
    """The tiny MAC layer over a 256-token document at initialisation: the writes of its
    (correlated) attention outputs must not diverge (they did with the layer's default theta)."""
    cfg = load_config("mac").model
    cfg.n_layers = 1
    model = build(cfg)
    tokens = jax.random.randint(jax.random.key(0), (2, 256), 4, cfg.vocab_size)
    block = model.blocks[0]
    _, aux = _COLLECT(block.mixer, block.mixer_norm(model.embed(tokens)), jnp.ones((2, 256), jnp.int32))
    norms = [float(jnp.linalg.norm(p[s])) for p in aux["state_in"][0] for s in range(4)]
    assert np.isfinite(norms).all() and max(norms) < 10 * min(norms), norms
    assert np.isfinite(np.asarray(aux["m_reads"])).all()


# ----------------------------------------------------------------------------- carried state
from functools import cache as _cache  # noqa: E402

from titans_lm.memory.config import MemoryConfig  # noqa: E402
from titans_lm.memory.layer import NeuralMemory  # noqa: E402
from titans_lm.nn.gated_combine import GatedCombine  # noqa: E402
from titans_lm.nn.stream import fresh_stream_state, make_stream  # noqa: E402

FAST_COMPILE = {"xla_backend_optimization_level": 0}
TS, NS = 30, 8   # stream length, segment length (chunk 4)
# Documents at 0, a segment start (16) and inside a segment at a chunk start (20) and mid-chunk
# (26, not a memory reset: as in one call); padding 12..13.
SEG_S = np.array([[1] * 12 + [0] * 2 + [1] * 2 + [2] * 4 + [3] * 6 + [4] * 4,
                  [7] * 20 + [8] * 10], np.int32)


@_cache
def _stateful_mixers():
    with nnx.use_eager_sharding(False):
        rngs = nnx.Rngs(0)
        cfg = MemoryConfig(d_model=16, n_heads=2, head_dim=8, chunk_size=4, dtype="float64",
                           param_dtype="float64", theta_max=0.5, alpha_bias_init=-2.0)
        attention = lambda: ContextAttention(16, 2, n_persistent=2, dtype=jnp.float64,  # noqa: E731
                                             param_dtype=jnp.float64, init_std=0.3, rngs=rngs)
        combine = lambda: GatedCombine(16, dtype=jnp.float64, param_dtype=jnp.float64,  # noqa: E731
                                       rngs=rngs)
        mac = MACMixer(NeuralMemory(cfg, rngs=rngs), attention(), combine(), NS)  # the paper's
        return {"mac": mac, "segment_attention": SegmentAttentionMixer(attention(), NS)}


@_cache
def _stateful_step(name):
    graphdef, params = nnx.split(_stateful_mixers()[name])
    fn = jax.jit(lambda p, x, stream, state: nnx.merge(graphdef, p)(x, stream, state),
                 compiler_options=FAST_COMPILE)
    return lambda *a: fn(params, *a)


def _run_calls(name, x, cuts):
    step, mixer = _stateful_step(name), _stateful_mixers()[name]
    sstate, state, ys = fresh_stream_state(x.shape[0]), mixer.init_state(x.shape[0]), []
    for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        stream, sstate = make_stream(jnp.asarray(SEG_S[:, a:b]), sstate, fresh=i == 0)
        y, state = step(x[:, a:b], stream, state)
        ys.append(y)
    return jnp.concatenate(ys, axis=1), state


# MAC as configured (memory_input="segment_input"): tests/models/test_stateful.py (split calls,
# decode); here the segment attention and the paper's wiring (its write conv tail holds
# projections of the attention output).
@pytest.mark.parametrize("name", ["segment_attention", "mac"])
def test_split_calls_and_token_by_token_equal_one_call(name):
    """Splits inside a chunk (3), at a chunk start inside a segment (4, 12), at segment starts
    (8, 16), inside a segment (13, 21), all in one stream, its last call spanning a segment start
    (24); and one token per call, through the padding (12..13) and every document start. Few
    distinct call lengths (each one a compilation)."""
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.key(3), (2, TS, 16), jnp.float64)
        whole, end = _run_calls(name, x, [0, TS])
        for cuts in ([0, 3, 4, 8, 12, 13, 16, 21, TS], list(range(TS + 1))):
            y, state = _run_calls(name, x, cuts)
            err = float(jnp.max(jnp.abs(y - whole)))
            assert err < 1e-12, f"cuts {cuts[:5]}: {err:.2e}"
            for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(end)):
                np.testing.assert_allclose(a, b, atol=1e-12)


def test_carried_state_reaches_later_calls():
    """The second call's output depends on the first call's tokens through the carried memory."""
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.key(4), (2, TS, 16), jnp.float64)
        y, _ = _run_calls("mac", x, [0, 16, TS])
        y2, _ = _run_calls("mac", x.at[:, 2].add(1.0), [0, 16, TS])
        assert float(jnp.max(jnp.abs(y[1, 16:] - y2[1, 16:]))) > 1e-6   # row 1: one document
        np.testing.assert_array_equal(y[:, :2], y2[:, :2])
