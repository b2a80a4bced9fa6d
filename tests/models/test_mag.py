"""Titans MAG backbone: sliding-window attention and the memory in parallel, combined by a gate
(or summed: LaCT's block, configs/lact.py)."""

import jax.numpy as jnp
import numpy as np
from flax import nnx

from _backbones import build, forward_mixer, load_config, mixer_input, run_probe, small_model_cfg
from titans_lm.models.mag import MAGMixer
from titans_lm.nn.attention import Attention

NP = 3


def test_causal_and_packed_documents_equal_alone():
    model = run_probe("mag")  # 3 persistent tokens, window 24
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
    mixer = build(small_model_cfg("mag", "float32", n_layers=1)).blocks[0].mixer
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
    assert load_config("mag", "340m").model.window == 1024
    model = build(small_model_cfg("mag", "float32", n_layers=1, n_persistent=0))
    assert model.persistent is None and model.blocks[0].mixer.attention.n_persistent == 0
    assert "persistent" not in nnx.to_pure_dict(nnx.state(model, nnx.Param))


def test_the_sum_combine_adds_the_branches():
    """``combine="sum"`` (LaCT's block): o = y + m, no gate, no parameters of its own."""
    mixer = build(small_model_cfg("mag", "float32", n_layers=1, combine="sum")).blocks[0].mixer
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
