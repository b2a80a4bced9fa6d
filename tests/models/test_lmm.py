"""Titans LMM backbone, and the ablation switches of the memory (Titans table 5) on it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from _backbones import (build, copy_shared_params, forward_mixer, load_config, mixer_input,
                        run_probe, small_model_cfg)
from titans_lm.memory.inner_models import LinearMemory, MLPMemory
from titans_lm.models.memory_mixer import MemoryMixer

NP = 3  # persistent tokens of the test configs: not a multiple of the chunk size 16


def test_the_lmm_is_memory_layers_after_persistent_tokens():
    """(Causality and documents: tests/models/test_documents.py; Atlas' below.)"""
    model = build(small_model_cfg("lmm", "float32"))
    assert isinstance(model.blocks[0].mixer, MemoryMixer) and model.blocks[0].mixer.memory.cfg.eta_max == 0.9
    assert model.persistent.tokens[...].shape == (NP, 32)


def _one_layer(dtype="float64", **changes):
    return build(small_model_cfg("lmm", dtype, n_layers=1, **changes))


def _names(model):
    return set(nnx.to_pure_dict(nnx.state(model.blocks[0].mixer.memory, nnx.Param)))


def _mixer_out(model):
    x, ids = mixer_input(n_prefix=NP)
    return np.asarray(forward_mixer(model.blocks[0].mixer, x, ids))


def _project(memory, x, ids):
    """The memory's projections of one window (a fresh stream)."""
    from titans_lm.nn.stream import fresh_stream_state, make_stream
    stream, _ = make_stream(ids, fresh_stream_state(x.shape[0]), fresh=True)
    return memory.project(x, stream)[0]


@pytest.mark.parametrize("switch,bias,gate", [("use_decay", "alpha_b", "alpha"),
                                              ("use_momentum", "eta_b", "eta")])
def test_gate_switch_off_is_the_gate_held_at_zero(switch, bias, gate):
    """Off: no parameters for the gate, the gate is exactly 0, and the layer equals the on-layer
    whose gate bias is pushed to -1e4 (sigmoid = 0 exactly)."""
    with jax.enable_x64(True):
        on = _one_layer()
        off = _one_layer(**{f"memory__{switch}": False})
        weights = {bias, bias.replace("_b", "_w")}
        assert weights <= _names(on) and not weights & _names(off)
        x, ids = mixer_input(n_prefix=NP)
        inputs = _project(off.blocks[0].mixer.memory, x, ids)
        np.testing.assert_array_equal(np.asarray(getattr(inputs, gate)), 0.0)
        assert float(jnp.max(getattr(_project(on.blocks[0].mixer.memory, x, ids), gate))) > 0
        copy_shared_params(on, off)
        with_gate = _mixer_out(on)
        getattr(on.blocks[0].mixer.memory, bias)[...] = jnp.full((2,), -1e4)
        np.testing.assert_allclose(_mixer_out(on), _mixer_out(off), rtol=0, atol=1e-12)
        assert np.abs(with_gate - _mixer_out(off)).max() > 1e-6


def test_conv_off_drops_conv_and_equals_identity_taps():
    with jax.enable_x64(True):
        on = _one_layer()
        off = _one_layer(memory__use_conv=False)
        conv = {"conv_q", "conv_k", "conv_v"}
        assert conv <= _names(on) and not conv & _names(off)
        copy_shared_params(off, on)
        with_conv = _mixer_out(on)
        for c in conv:  # taps that pass the current token through (row 0)
            w = getattr(on.blocks[0].mixer.memory, c)
            w[...] = jnp.zeros_like(w[...]).at[0].set(1.0)
        np.testing.assert_allclose(_mixer_out(on), _mixer_out(off), rtol=0, atol=1e-12)
        assert np.abs(with_conv - _mixer_out(off)).max() > 1e-6


def test_persistent_tokens_zero_drops_them():
    assert "persistent" in nnx.to_pure_dict(nnx.state(_one_layer("float32"), nnx.Param))
    model = _one_layer("float32", n_persistent=0)
    assert model.persistent is None
    assert "persistent" not in nnx.to_pure_dict(nnx.state(model, nnx.Param))


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_memory_depth_sets_the_inner_model(depth):
    memory = _one_layer("float32", memory__memory_depth=depth).blocks[0].mixer.memory
    shapes = [p[...].shape for p in memory.w0]
    H, Dh, hidden = 2, 16, 32  # memory_expansion 2
    if depth == 1:
        assert memory.model == LinearMemory() and shapes == [(H, Dh, Dh)]
    else:
        assert isinstance(memory.model, MLPMemory) and memory.model.depth == depth
        assert shapes == [(H, Dh, hidden)] + [(H, hidden, hidden)] * (depth - 2) + [(H, hidden, Dh)]


def test_memory_depth_and_chunk_size_change_the_outputs():
    with jax.enable_x64(True):
        base = _one_layer()
        out = _mixer_out(base)
        for changes in ({"memory__memory_depth": 1}, {"memory__chunk_size": 8}):
            other = _one_layer(**changes)
            copy_shared_params(base, other)
            y = _mixer_out(other)
            assert np.isfinite(y).all() and np.abs(y - out).max() > 1e-8, changes


def test_memory_output_projection_gets_the_residual_init():
    cfg = small_model_cfg("lmm", "float32", d_model=256, n_layers=4, memory__head_dim=64)
    w_out = np.asarray(build(cfg).blocks[0].mixer.memory.w_out[...])
    assert abs(w_out.std() - 0.02 / np.sqrt(8)) < 0.002  # scaled_out_std(0.02, 4 layers)


def test_jvp_of_the_loss_through_the_model_matches_a_finite_difference():
    """Forward-mode differentiation through the whole model (``forward_mode()`` on the CPU,
    ``titans_lm.nn.project``): the directional derivative of the tiny LMM's loss w.r.t. its
    parameters equals a central finite difference (float64; ``jax.linearize`` is this jvp
    partially evaluated, nothing of its own to test)."""
    from titans_lm.nn.project import forward_mode
    from titans_lm.train.state import model_fns
    from titans_lm.train.step import loss_sums, split_batch
    with jax.enable_x64(True):
        fns = model_fns(small_model_cfg("lmm", "float64"))
        params = nnx.to_pure_dict(nnx.state(build(small_model_cfg("lmm", "float64")), nnx.Param))
        rng = np.random.default_rng(0)
        tokens = rng.integers(4, 64, (2, 33)).astype(np.int32)
        batch = {"tokens": jnp.asarray(tokens), "segment_ids": jnp.ones((2, 33), jnp.int32)}
        inputs, targets, seg, w = split_batch(batch)

        def loss(p):
            logits, _ = fns.apply(p, inputs, seg, fns.init_state(p, 2))
            nll, n = loss_sums(logits, targets, w)
            return nll / n
        leaves, tree = jax.tree.flatten(params)
        keys = jax.random.split(jax.random.key(3), len(leaves))
        direction = [jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)]
        norm = float(np.sqrt(sum(float(jnp.sum(d * d)) for d in direction)))
        direction = jax.tree.unflatten(tree, [d / norm for d in direction])  # a unit direction
        with forward_mode():
            value, tangent = jax.jit(lambda p, d: jax.jvp(loss, (p,), (d,)))(params, direction)
        h = 1e-4
        shifted = lambda s: jax.tree.map(lambda p, d: p + s * d, params, direction)  # noqa: E731
        jloss = jax.jit(loss)  # one compilation for the three plain evaluations
        fd = (float(jloss(shifted(h))) - float(jloss(shifted(-h)))) / (2 * h)
        assert abs(float(tangent)) > 1e-6
        np.testing.assert_allclose(float(tangent), fd, rtol=1e-6)
        np.testing.assert_allclose(float(value), float(jloss(params)), rtol=1e-12)


def test_atlas_is_causal_and_keeps_documents_apart():
    """configs/atlas.py at test size (the LMM written by the Omega rule over 16 tokens, Muon on
    the momentum and polynomial keys: key width 152 at head_dim 16); its -mag size is the same
    memory in MAG."""
    model = run_probe("atlas")
    cfg = model.blocks[0].mixer.memory.cfg
    assert (cfg.omega_window, cfg.ns_steps, cfg.feature_map, cfg.key_width) == (16, 5, "poly", 152)
    mag = load_config("atlas", "tiny-mag").model
    assert mag.name == "mag" and mag.memory.omega_window == 16 and mag.memory.ns_steps == 5
