"""Titans MAC backbone: segment-wise retrieval, attention over [persistent || h || segment], write
with the attention output, read after each token's own write."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from _backbones import build, load_config, run_probe, small_model_cfg
from titans_lm.models.mac import MACMixer, SegmentAttentionMixer
from titans_lm.nn.context_attention import ContextAttention

N = 32  # segment length of the test configs


def test_causal_and_packed_documents_equal_alone():
    """Segments of 32: documents start on segment starts. Causality is checked inside one chunk
    and one segment too (perturbed positions 21, 40, 93, 127)."""
    model = run_probe("mac")
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


_COLLECT = nnx.jit(lambda m, x, s: m.forward(x, s, collect=True))


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
    """M*(y_t) equals a read after writing exactly y_1..y_t of the segment into the state left by
    the earlier segments (no later write reaches it)."""
    with jax.enable_x64(True):
        mixer = _mixer(memory__use_conv=False)
        mem = mixer.memory
        x = jax.random.normal(jax.random.key(1), (1, 128, 32), jnp.float64)
        ids = jnp.ones((1, 128), jnp.int32)
        _, aux = _COLLECT(mixer, x, ids)
        n = 2
        state = jax.tree.map(lambda a: a[n], aux["state_in"])
        y = aux["y"][n]
        for t in (0, 5, 16, 21, N - 1):  # chunk starts, inside chunks, the segment end
            w = mem.project(y[:, :t + 1], ids[:, :t + 1])  # eta bounded by the layer (eta_max)
            reads, _ = mem.scan(state, w.q, w.k, w.v, w.theta, w.eta, w.alpha, None)
            np.testing.assert_allclose(reads[:, :, t], aux["m_reads"][n][:, :, t], rtol=1e-10,
                                       atol=1e-12)


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
