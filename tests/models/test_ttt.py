"""TTT-Linear and TTT-MLP backbones (the memory engine with TTT's settings)."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from _backbones import build, load_config, mixer_input, run_probe, small_model_cfg
from titans_lm.memory.inner_models import LinearMemory, MLPMemory, ResidualLN
from titans_lm.models.memory_mixer import MemoryMixer


@pytest.mark.parametrize("name", ["ttt_linear", "ttt_mlp"])
def test_ttt_is_memory_layers_without_persistent_tokens(name):
    """(Causality and documents: tests/models/test_documents.py.)"""
    model = build(small_model_cfg(name, "float32"))
    assert isinstance(model.blocks[0].mixer, MemoryMixer) and model.persistent is None


@pytest.mark.parametrize("name,inner", [
    ("ttt_linear", ResidualLN(LinearMemory(bias=True), fast_ln=False)),
    ("ttt_mlp", ResidualLN(MLPMemory(depth=2, expansion=4.0, activation="gelu_tanh", bias=True),
                           fast_ln=False))])
def test_ttt_settings(name, inner):
    cfg = load_config(name).model
    assert cfg.memory.chunk_size == 16 and cfg.memory.head_dim == 64
    assert cfg.memory.read_running_mean and cfg.memory.memory_bias and not cfg.memory.memory_ln_fast
    # TTT-Linear's base lr 1.0 (both; TTT-MLP's paper: 0.1) for TTT's 0.5-scaled loss and
    # mini-batch mean, in the engine's convention
    base_lr = cfg.memory.ttt_base_lr
    assert base_lr == 1.0 / (2 * cfg.memory.chunk_size)
    assert cfg.memory.use_decay and cfg.memory.decay_target == "initial"  # the deviation for length
    shipped = build(small_model_cfg(name, "float32", n_layers=1)).blocks[0].mixer.memory
    names = set(nnx.to_pure_dict(nnx.state(shipped, nnx.Param)))
    assert {"alpha_w", "alpha_b"} <= names
    # both ship the Mamba backbone's short convolution
    assert {"conv_q", "conv_k", "conv_v"} <= names
    # TTT's layer as published (the Transformer backbone's): use_decay and use_conv off
    memory = build(small_model_cfg(name, "float32", n_layers=1, memory__use_decay=False,
                                   memory__use_conv=False)).blocks[0].mixer.memory
    assert memory.model == inner
    names = set(nnx.to_pure_dict(nnx.state(memory, nnx.Param)))
    assert "w0" in names and not {"eta_w", "eta_b", "alpha_w", "alpha_b", "conv_q", "w_gate"} & names
    # learned W0 per head: the inner model's matrices and fast biases, then the LayerNorm scale
    # and shift (outer-loop parameters: the inner loop leaves them as they are)
    shapes = [p[...].shape for p in memory.w0]
    assert shapes[-2:] == [(2, 16), (2, 16)] and shapes[1] == (2, shapes[0][-1])
    n = len(shapes)
    assert memory.model.outer_params() == {n - 2, n - 1}
    x, ids = mixer_input(dtype=jnp.float32)
    from titans_lm.nn.stream import fresh_stream_state, make_stream
    g = memory.project(x, make_stream(ids, fresh_stream_state(x.shape[0]), fresh=True)[0])[0]
    np.testing.assert_array_equal(np.asarray(g.eta), 0.0)  # no momentum
    np.testing.assert_array_equal(np.asarray(g.alpha), 0.0)  # no decay
    real = np.asarray(ids != 0)[:, None, :]
    theta = np.asarray(g.theta)
    # TTT's inner learning rate base_lr * sigmoid(.) / head_dim, 0 on padding
    assert (theta[np.broadcast_to(real, theta.shape)] > 0).all()
    assert theta.max() < base_lr / 16 and (theta[np.broadcast_to(~real, theta.shape)] == 0).all()


def test_gate_variant():
    model = run_probe("ttt_linear", memory__use_output_gate=True)
    names = set(nnx.to_pure_dict(nnx.state(model.blocks[0].mixer.memory, nnx.Param)))
    assert {"w_gate", "conv_q", "conv_k", "conv_v"} <= names


def test_name_and_inner_model_must_agree():
    with pytest.raises(ValueError, match="memory_depth = 1"):
        build(small_model_cfg("ttt_linear", "float32", memory__memory_depth=2))
    with pytest.raises(ValueError, match="memory_depth >= 2"):
        build(small_model_cfg("ttt_mlp", "float32", memory__memory_depth=1))
