"""The memory as a token mixer: config mapping, persistent prefixes, layer selection."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from titans_lm.config.backbones import memory_section
from titans_lm.memory.config import MemoryConfig
from titans_lm.memory.layer import NeuralMemory
from titans_lm.models.memory_mixer import (MemoryMixer, make_memory, memory_config,
                                           memory_layer_indices)
from titans_lm.nn.segments import PERSISTENT_SEGMENT_ID
from titans_lm.nn.stream import fresh_stream_state, make_stream


def _model_cfg(**memory):
    return ml_collections.ConfigDict({"name": "x", "d_model": 32, "dtype": "float64",
                                      "param_dtype": "float64",
                                      "memory": memory_section(**{"head_dim": 16, **memory})})


def test_memory_config_maps_the_section():
    cfg = memory_config(_model_cfg(chunk_size=8, use_decay=False))
    assert cfg == MemoryConfig(d_model=32, n_heads=2, head_dim=16, chunk_size=8, use_decay=False,
                               dtype="float64", param_dtype="float64")
    assert memory_config(_model_cfg(n_heads=3)).n_heads == 3  # explicit head count kept
    with pytest.raises(ValueError, match="head_dim=12 must divide model.d_model=32"):
        memory_config(_model_cfg(head_dim=12))
    with pytest.raises(ValueError, match="unknown MemoryConfig field"):
        m = _model_cfg()
        m.memory.bogus = 1
        memory_config(m)
    with pytest.raises(ValueError, match="taken from the model section"):
        m = _model_cfg()
        m.memory.dtype = "float32"
        memory_config(m)
    with pytest.raises(ValueError, match="no 'memory' section"):
        memory_config(ml_collections.ConfigDict({"name": "x", "d_model": 32}))


def test_memory_layer_indices():
    assert memory_layer_indices("all", 3) == {0, 1, 2}
    assert memory_layer_indices("none", 3) == set()
    assert memory_layer_indices("0, 2", 3) == {0, 2}
    assert memory_layer_indices("-1", 3) == {2}
    with pytest.raises(ValueError, match="outside the 3 layers"):
        memory_layer_indices("3", 3)
    with pytest.raises(ValueError, match="'all', 'none' or comma-separated"):
        memory_layer_indices("every other", 3)


def _memory(**kw):
    cfg = MemoryConfig(d_model=32, n_heads=2, head_dim=16, chunk_size=4, dtype="float64",
                       param_dtype="float64", **kw)
    return NeuralMemory(cfg, rngs=nnx.Rngs(0))


def call(mixer, x, ids):
    """One call from a fresh state (the training path)."""
    stream, _ = make_stream(ids, fresh_stream_state(x.shape[0]), fresh=True)
    return mixer(x, stream, mixer.init_state(x.shape[0]))[0]


def with_prefix(mixer, x, ids, n_prefix):
    """The first n_prefix positions (persistent) as their own call, as LanguageModel.init_state
    runs them, then the rest from the state they leave (stream position back to 0)."""
    B = x.shape[0]
    sp, st = make_stream(ids[:, :n_prefix], fresh_stream_state(B), fresh=True)
    y_p, state = mixer(x[:, :n_prefix], sp, mixer.init_state(B))
    sx, _ = make_stream(ids[:, n_prefix:], st._replace(position=jnp.zeros((), jnp.int32)),
                        fresh=True)
    y, _ = mixer(x[:, n_prefix:], sx, state)
    return jnp.concatenate([y_p, y], axis=1)


def test_prefix_equals_one_sequence_through_the_memory():
    """Without momentum and conv (which a document start resets) and with N_p a multiple of the
    chunk size, M over [p || doc] with the prefix as its own call equals one plain sequence."""
    with jax.enable_x64(True):
        mem = MemoryMixer(_memory(use_momentum=False, use_conv=False))
        x = jax.random.normal(jax.random.key(0), (1, 4 + 20, 32), jnp.float64)
        ids = jnp.asarray([[PERSISTENT_SEGMENT_ID] * 4 + [1] * 20])
        got = nnx.jit(lambda m, x, s: with_prefix(m, x, s, 4))(mem, x, ids)
        want = nnx.jit(call)(mem, x, jnp.ones_like(ids))
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-12)


def test_every_document_starts_from_the_prefix_state():
    """N_p = 3 (not a chunk multiple): two packed documents equal each alone after the prefix."""
    with jax.enable_x64(True):
        mixer = MemoryMixer(_memory())
        key = jax.random.split(jax.random.key(1), 3)
        p, a, b = (jax.random.normal(k, (n, 32), jnp.float64) for k, n in zip(key, (3, 8, 10)))
        z = lambda n: jnp.zeros((n, 32), jnp.float64)  # noqa: E731
        rows = [(jnp.concatenate([p, a, z(4), b]), [-1] * 3 + [1] * 8 + [0] * 4 + [2] * 10),
                (jnp.concatenate([p, a, z(14)]), [-1] * 3 + [1] * 8 + [0] * 14),
                (jnp.concatenate([p, b, z(12)]), [-1] * 3 + [5] * 10 + [0] * 12),
                (jnp.concatenate([p + 1.0, b, z(12)]), [-1] * 3 + [5] * 10 + [0] * 12)]
        x = jnp.stack([r[0] for r in rows])
        ids = jnp.asarray([r[1] for r in rows], jnp.int32)
        y = nnx.jit(lambda m, x, s: with_prefix(m, x, s, 3))(mixer, x, ids)
        np.testing.assert_allclose(y[0, :11], y[1, :11], rtol=0, atol=1e-12)
        np.testing.assert_allclose(y[0, 15:], y[2, 3:13], rtol=0, atol=1e-12)
        # the persistent tokens do reach the documents through the memory state
        assert float(jnp.abs(y[3, 3:13] - y[2, 3:13]).max()) > 1e-6


def test_make_memory_residual_init():
    cfg = MemoryConfig(d_model=128, n_heads=2, head_dim=64, memory_depth=1)
    with nnx.use_eager_sharding(False):   # normal_param (titans_lm.nn.init) needs it
        default = make_memory(cfg, rngs=nnx.Rngs(0))
        scaled = make_memory(cfg, rngs=nnx.Rngs(0), out_init_std=0.005)
    assert abs(float(jnp.std(scaled.w_out[...])) - 0.005) < 5e-4
    assert float(jnp.std(default.w_out[...])) > 0.03  # the layer's own fan-in init
    assert scaled.w_out.get_metadata()["out_sharding"] == ("heads", "head_dim", "embed")


def test_momentum_bound():
    """MemoryConfig.eta_max scales the layer's momentum gate and nothing else."""
    with jax.enable_x64(True):
        free, bounded = _memory(eta_max=1.0), _memory(eta_max=0.9)  # same seed: same parameters
        x = jax.random.normal(jax.random.key(4), (1, 20, 32), jnp.float64)
        ids = jnp.ones((1, 20), jnp.int32)
        stream, _ = make_stream(ids, fresh_stream_state(1), fresh=True)
        a, b = free.project(x, stream)[0], bounded.project(x, stream)[0]
        np.testing.assert_allclose(np.asarray(b.eta), 0.9 * np.asarray(a.eta), rtol=1e-15)
        np.testing.assert_array_equal(np.asarray(b.theta), np.asarray(a.theta))
        np.testing.assert_array_equal(np.asarray(b.alpha), np.asarray(a.alpha))
        run = nnx.jit(lambda m, x, s: call(MemoryMixer(m), x, s))
        assert float(jnp.abs(run(bounded, x, ids) - run(free, x, ids)).max()) > 1e-9
    with pytest.raises(ValueError, match="the momentum gate bound is model.memory.eta_max"):
        m = _model_cfg()
        m.memory_eta_max = 0.9
        memory_config(m)
