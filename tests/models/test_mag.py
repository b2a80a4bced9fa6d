"""Titans MAG backbone: sliding-window attention and the memory in parallel, summed (configs/mag.py,
LaCT's block) or combined by the paper's gate."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from _backbones import build, forward_mixer, load_config, mixer_input, run_probe, small_model_cfg
from titans_lm.models.mag import MAGMixer
from titans_lm.nn.attention import Attention
from titans_lm.nn.stream import fresh_stream_state, make_stream

NP = 3


def test_mag_layers_after_persistent_tokens():
    """(Causality and documents: tests/models/test_documents.py.)"""
    model = build(small_model_cfg("mag", "float32"))  # 3 persistent tokens, window 24
    assert [type(b.mixer) for b in model.blocks] == [MAGMixer, MAGMixer]
    assert model.persistent.tokens[...].shape == (NP, 32)
    assert model.blocks[0].mixer.attention.window == 24


def test_layers_without_memory_are_sliding_window_attention():
    model = run_probe("mag", memory_layers="1")
    assert type(model.blocks[0].mixer) is Attention and model.blocks[0].mixer.window == 24
    assert type(model.blocks[1].mixer) is MAGMixer


def test_a_silent_memory_gates_the_attention_by_one_half():
    """With the memory's output projection at zero, m = 0 and sigmoid(RMSNorm(0)) = 1/2:
    o = (RMSNorm_y(y) / 2) W_O, y the sliding-window attention."""
    mixer = build(small_model_cfg("mag", "float32", n_layers=1, combine="gate")).blocks[0].mixer
    mixer.memory.w_out[...] = jnp.zeros_like(mixer.memory.w_out[...])
    x, ids = mixer_input(dtype=jnp.float32, n_prefix=NP)
    got = forward_mixer(mixer, x, ids)
    c = mixer.combine
    y = forward_mixer(mixer.attention, x, ids)
    want = nnx.jit(lambda c, y: (c.norm_y(y) * 0.5) @ c.w_o[...])(c, y)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_config_and_persistent_switch():
    cfg = load_config("mag").model
    assert cfg.window == 64 and cfg.n_persistent == 4 and cfg.memory_layers == "all"
    assert cfg.combine == "sum"                                    # a deviation (configs/mag.py)
    assert load_config("atlas", "tiny-mag").model.combine == "gate"   # Atlas-MAG as published
    assert load_config("mag", "340m").model.window == 1024
    model = build(small_model_cfg("mag", "float32", n_layers=1, n_persistent=0))
    assert model.persistent is None and model.blocks[0].mixer.attention.n_persistent == 0
    assert "persistent" not in nnx.to_pure_dict(nnx.state(model, nnx.Param))


def test_the_sum_combine_adds_the_branches():
    """``combine="sum"`` (LaCT's block): o = y + m, no gate, no parameters of its own."""
    mixer = build(small_model_cfg("mag", "float32", n_layers=1)).blocks[0].mixer
    x, ids = mixer_input(dtype=jnp.float32, n_prefix=NP)
    got = forward_mixer(mixer, x, ids)
    y = forward_mixer(mixer.attention, x, ids)
    m = forward_mixer(mixer.memory, x, ids)
    np.testing.assert_allclose(np.asarray(got), np.asarray(y + m), rtol=1e-5, atol=1e-6)
    assert not nnx.to_pure_dict(nnx.state(mixer.combine, nnx.Param))


def test_lact_is_causal_and_keeps_documents_apart():
    """configs/lact.py at test size with chunks of 16 (SwiGLU fast weights, the dot bias,
    chunk-start reads, the weight norm toward the state the test's persistent tokens leave;
    window and memory summed)."""
    model = run_probe("lact", memory__chunk_size=16)
    mixer = model.blocks[0].mixer
    assert type(mixer) is MAGMixer and mixer.memory.cfg.fast_weight_norm


def _state_after(mixer, x_BTD):
    """The mixer's output and state after one call on ``x_BTD`` (one document a row)."""
    ids = jnp.ones(x_BTD.shape[:2], jnp.int32)
    stream, _ = make_stream(ids, fresh_stream_state(x_BTD.shape[0]), fresh=True)
    return mixer(x_BTD, stream, mixer.init_state(x_BTD.shape[0]))


def test_the_gated_read_ablation_zeroes_m_and_keeps_writing():
    """memory_ablation="gated_read" (an evaluation probe): o = (RMSNorm_y(y) / 2) W_O with the
    memory's parameters as trained, o = y with the sum combine, and the memory state after the call
    is the unablated layer's (the memory is still written)."""
    ablated = build(small_model_cfg("mag", "float32", n_layers=1, combine="gate",
                                    memory_ablation="gated_read"))
    mixer = ablated.blocks[0].mixer
    x, ids = mixer_input(dtype=jnp.float32, n_prefix=NP)
    c, y = mixer.combine, forward_mixer(mixer.attention, x, ids)
    want = nnx.jit(lambda c, y: (c.norm_y(y) * 0.5) @ c.w_o[...])(c, y)
    np.testing.assert_allclose(np.asarray(forward_mixer(mixer, x, ids)), np.asarray(want),
                               rtol=1e-5, atol=1e-6)
    summed = build(small_model_cfg("mag", "float32", n_layers=1,
                                   memory_ablation="gated_read")).blocks[0].mixer
    np.testing.assert_allclose(np.asarray(forward_mixer(summed, x, ids)),
                               np.asarray(forward_mixer(summed.attention, x, ids)), rtol=1e-6)
    plain = build(small_model_cfg("mag", "float32", n_layers=1, combine="gate")).blocks[0].mixer
    xs = jax.random.normal(jax.random.key(3), (2, 16, 32), jnp.float32)
    (o_a, s_a), (o_p, s_p) = _state_after(mixer, xs), _state_after(plain, xs)
    assert float(jnp.abs(o_a - o_p).max()) > 1e-4
    for a, p in zip(jax.tree.leaves(s_a), jax.tree.leaves(s_p)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(p))
    with pytest.raises(ValueError, match="MAG memory_ablation='retrieval': must be one of none, "
                                         "gated_read"):
        build(small_model_cfg("mag", "float32", n_layers=1, memory_ablation="retrieval"))
