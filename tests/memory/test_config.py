"""MemoryConfig: defaults, validation messages, mapping from a config section."""

import dataclasses

import ml_collections
import pytest

from titans_lm.memory import LinearMemory, MLPMemory, ResidualLN
from titans_lm.memory.config import MemoryConfig
from _memory_call import call_fresh


def test_defaults_and_inner_model():
    cfg = MemoryConfig(d_model=64)
    assert (cfg.chunk_size, cfg.memory_depth, cfg.gate_style, cfg.impl) == (16, 2, "titans", "chunked")
    assert cfg.inner_model() == MLPMemory(depth=2, expansion=4.0, activation="silu", bias=False)
    assert MemoryConfig(d_model=8, memory_depth=1).inner_model() == LinearMemory()
    ttt = MemoryConfig(d_model=8, memory_depth=2, memory_residual_ln=True, memory_activation="gelu_tanh")
    assert ttt.inner_model() == ResidualLN(MLPMemory(depth=2, activation="gelu_tanh"))


def test_from_a_config_section_one_to_one():
    section = ml_collections.ConfigDict({"n_heads": 2, "head_dim": 16, "use_momentum": False,
                                         "chunk_size": 8})
    cfg = MemoryConfig.from_dict(section, d_model=32)
    assert (cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.use_momentum, cfg.chunk_size) == (32, 2, 16, False, 8)
    every_field = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(MemoryConfig)}
    assert MemoryConfig.from_dict(every_field) == cfg
    with pytest.raises(ValueError, match=r"unknown MemoryConfig field\(s\) \['chunk'\]"):
        MemoryConfig.from_dict({"chunk": 8}, d_model=32)


@pytest.mark.parametrize("field, value, message", [
    ("memory_depth", 5, "memory_depth: must be in 1..4"),
    ("chunk_size", 0, "chunk_size: must be a positive int"),
    ("chunks_per_checkpoint", -1, r"chunks_per_checkpoint: must be an int >= 0 \(0: no rematerialisation\)"),
    ("gate_style", "mamba", "gate_style: must be one of"),
    ("gate_granularity", "mean", "gate_granularity: must be one of"),
    ("theta_max", 0.0, "theta_max: must be positive"),
    ("eta_max", 0.0, r"eta_max: must be in \(0, 1\]"),
    ("eta_max", 1.5, r"eta_max: must be in \(0, 1\]"),
    ("impl", "cuda", "impl: must be one of"),
    ("dtype", "float16", "dtype: must be one of"),
    ("read", "before", "read: must be one of"),
    ("memory_activation", "relu", "memory_activation"),
    ("theta_ref_head_dim", -64, r"theta_ref_head_dim: must be an int >= 0"),
])
def test_bad_values_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        MemoryConfig(d_model=8, **{field: value})


def test_defaults_are_in_the_stable_range():
    """MemoryConfig's own defaults: the worst-case chunk write stays below 2 (1 + eta^b), and a
    plain layer stays finite on a window of near-identical tokens (the former defaults,
    theta_max 0.1 and eta_max 1.0, overflowed)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from titans_lm.memory import NeuralMemory
    from titans_lm.memory.config import chunk_write_gain

    cfg = MemoryConfig(d_model=32, n_heads=2, head_dim=16, memory_expansion=2.0)
    assert (cfg.theta_max, cfg.eta_max) == (0.0005, 0.9)
    assert cfg.write_gain() < 2 * (1 + cfg.eta_max ** cfg.chunk_size)
    assert chunk_write_gain(0.5, 0.0, 1) == 1.0          # delta rule: 2 theta ||k||^2
    assert chunk_write_gain(0.05, 0.88, 16) > 2 * (1 + 0.88 ** 16)
    x = (jax.random.normal(jax.random.key(1), (1, 1, 32))
         + 0.05 * jax.random.normal(jax.random.key(2), (1, 256, 32)))
    outs = []
    for kw in ({}, {"theta_max": 0.1, "eta_max": 1.0}):
        with nnx.use_eager_sharding(False):
            layer = NeuralMemory(dataclasses.replace(cfg, **kw), rngs=nnx.Rngs(0))
        outs.append(bool(jnp.isfinite(call_fresh(layer, x)).all()))
    assert outs == [True, False]


def test_theta_bound_scales_with_the_head_width():
    """theta_ref_head_dim D: theta's bound is theta_max sqrt(head_dim / D), in the gates too (a
    layer at head_dim 16 with 0.3 stated for 64 is the layer with 0.15); TTT's gate refuses it."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from titans_lm.memory import NeuralMemory

    base = dict(d_model=32, n_heads=2, head_dim=16, memory_expansion=2.0, surprise_max_norm=1.0)
    scaled = MemoryConfig(theta_max=0.3, theta_ref_head_dim=64, **base)
    assert scaled.theta_bound == 0.15 and MemoryConfig(theta_max=0.3, **base).theta_bound == 0.3
    assert MemoryConfig(d_model=64, head_dim=64, theta_max=0.3, theta_ref_head_dim=64).theta_bound == 0.3
    assert scaled.write_gain() == MemoryConfig(theta_max=0.15, **base).write_gain()
    x = jax.random.normal(jax.random.key(3), (1, 32, 32))
    outs = []
    for cfg in (scaled, MemoryConfig(theta_max=0.15, **base), MemoryConfig(theta_max=0.3, **base)):
        with nnx.use_eager_sharding(False):
            outs.append(call_fresh(NeuralMemory(cfg, rngs=nnx.Rngs(0)), x))
    assert jnp.array_equal(outs[0], outs[1]) and not jnp.allclose(outs[0], outs[2])
    with pytest.raises(ValueError, match="theta_ref_head_dim: > 0 scales theta_max, which "
                                         "gate_style 'ttt' does not use"):
        MemoryConfig(gate_style="ttt", theta_ref_head_dim=64, **base)
