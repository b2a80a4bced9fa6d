"""MemoryConfig: defaults, validation messages, mapping from a config section."""

import dataclasses

import ml_collections
import pytest

from titans_lm.memory import LinearMemory, MLPMemory, ResidualLN
from titans_lm.memory.config import MemoryConfig


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
    ("gate_style", "mamba", "gate_style: must be one of"),
    ("gate_granularity", "mean", "gate_granularity: must be one of"),
    ("theta_max", 0.0, "theta_max: must be positive"),
    ("eta_max", 0.0, r"eta_max: must be in \(0, 1\]"),
    ("eta_max", 1.5, r"eta_max: must be in \(0, 1\]"),
    ("impl", "cuda", "impl: must be one of"),
    ("dtype", "float16", "dtype: must be one of"),
    ("read", "before", "read: must be one of"),
    ("memory_activation", "relu", "memory_activation"),
])
def test_bad_values_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        MemoryConfig(d_model=8, **{field: value})
