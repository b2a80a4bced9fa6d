"""Titans MAL backbone: the memory as a residual layer, then sliding-window attention."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _backbones import build, forward_mixer, load_config, mixer_input, small_model_cfg
from titans_lm.models.mal import MALMixer
from titans_lm.nn.attention import Attention
from titans_lm.nn.stream import fresh_stream_state, make_stream

NP = 3


def test_mal_layers_after_persistent_tokens():
    """(Causality and documents: tests/models/test_documents.py.)"""
    model = build(small_model_cfg("mal", "float32"))  # 3 persistent tokens, window 24
    assert [type(b.mixer) for b in model.blocks] == [MALMixer, MALMixer]
    assert model.persistent.tokens[...].shape == (NP, 32)


def test_layers_without_memory_are_sliding_window_attention():
    model = build(small_model_cfg("mal", "float32", memory_layers="0"))
    assert type(model.blocks[0].mixer) is MALMixer
    assert type(model.blocks[1].mixer) is Attention and model.blocks[1].mixer.window == 24


def test_memory_feeds_the_attention():
    """o = SWA(x + M(x)): with a silent memory (W_O = 0) the layer is its attention alone, and the
    memory's W_O starts at the residual init (small), so at initialisation the layer is close to
    it."""
    mixer = build(small_model_cfg("mal", "float32", n_layers=1)).blocks[0].mixer
    x, ids = mixer_input(dtype=jnp.float32, n_prefix=NP)
    full = np.asarray(forward_mixer(mixer, x, ids))
    attn_only = np.asarray(forward_mixer(mixer.attention, x, ids))
    assert 0 < np.abs(full - attn_only).max() < 0.5 * np.abs(attn_only).max()
    mixer.memory.w_out[...] = jnp.zeros_like(mixer.memory.w_out[...])
    np.testing.assert_allclose(np.asarray(forward_mixer(mixer, x, ids)), attn_only, rtol=1e-6, atol=1e-7)


def test_read_to_output_adds_the_memory_read_to_the_attention_output():
    """read_to_output=True (a deviation): o = SWA(x + M(x)) + M(x), the same parameters as the
    paper's layer; with the read ablated it is again the attention alone."""
    plain = build(small_model_cfg("mal", "float32", n_layers=1)).blocks[0].mixer
    summed = build(small_model_cfg("mal", "float32", n_layers=1, read_to_output=True)).blocks[0].mixer
    x, ids = mixer_input(dtype=jnp.float32, n_prefix=NP)
    m = np.asarray(forward_mixer(summed.memory, x, ids))
    assert np.abs(m).max() > 1e-3
    np.testing.assert_allclose(np.asarray(forward_mixer(summed, x, ids)),
                               np.asarray(forward_mixer(plain, x, ids)) + m, rtol=1e-5, atol=1e-6)
    ablated = build(small_model_cfg("mal", "float32", n_layers=1, read_to_output=True,
                                    memory_ablation="read")).blocks[0].mixer
    np.testing.assert_allclose(np.asarray(forward_mixer(ablated, x, ids)),
                               np.asarray(forward_mixer(ablated.attention, x, ids)), rtol=1e-6, atol=1e-7)


def test_config():
    cfg = load_config("mal").model
    assert cfg.window == 64 and cfg.n_persistent == 4 and cfg.memory_layers == "all"
    assert cfg.read_to_output is False  # the paper's layer
    assert abs(float(np.asarray(build(small_model_cfg("mal", "float32", n_layers=4))
                                .blocks[0].mixer.memory.w_out[...]).std()) - 0.02 / np.sqrt(8)) < 0.004


def test_the_read_ablation_leaves_the_attention_alone_and_keeps_writing():
    """memory_ablation="read" (an evaluation probe): o = SWA(x), the memory's parameters as
    trained, and its memory's state after the call is the unablated layer's (the memory is still
    written; the attention's cache holds x instead of x + m)."""
    mixer = build(small_model_cfg("mal", "float32", n_layers=1, memory_ablation="read")).blocks[0].mixer
    x, ids = mixer_input(dtype=jnp.float32, n_prefix=NP)
    np.testing.assert_allclose(np.asarray(forward_mixer(mixer, x, ids)),
                               np.asarray(forward_mixer(mixer.attention, x, ids)), rtol=1e-6, atol=1e-7)
    plain = build(small_model_cfg("mal", "float32", n_layers=1)).blocks[0].mixer
    xs = jax.random.normal(jax.random.key(3), (2, 16, 32), jnp.float32)
    stream, _ = make_stream(jnp.ones((2, 16), jnp.int32), fresh_stream_state(2), fresh=True)
    (o_a, s_a), (o_p, s_p) = (m(xs, stream, m.init_state(2)) for m in (mixer, plain))
    assert float(jnp.abs(o_a - o_p).max()) > 1e-4
    for a, p in zip(jax.tree.leaves(s_a[0]), jax.tree.leaves(s_p[0])):  # the memory's state
        np.testing.assert_array_equal(np.asarray(a), np.asarray(p))
    with pytest.raises(ValueError, match="MAL memory_ablation='gated_read': must be one of none, read"):
        build(small_model_cfg("mal", "float32", n_layers=1, memory_ablation="gated_read"))
