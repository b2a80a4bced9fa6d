"""The memory backbones' config builders (titans_lm.config.backbones): the memory section mirrors
MemoryConfig, the Titans memory, backbone_config at tiny and paper sizes. (The run presets:
tests/config/test_presets.py.)"""

import dataclasses

import pytest

from _backbones import load_config
from titans_lm.config import validate
from titans_lm.config.backbones import (MEMORY_DEFAULTS, MEMORY_VARIANTS, PRESET_WRITE,
                                        RAISED_WRITE, TITANS_MEMORY,
                                        backbone_config, memory_section, memory_variant,
                                        titans_config, titans_memory_section, ttt_config)
from titans_lm.config.presets import PAPER_SIZES
from titans_lm.memory.config import MemoryConfig


def test_memory_section_has_every_switch():
    s = memory_section(head_dim=64, use_decay=False)
    want = {f.name for f in dataclasses.fields(MemoryConfig)} - {"d_model", "dtype", "param_dtype"}
    assert set(s.keys()) == want
    assert s.n_heads == 0 and s.head_dim == 64 and s.use_decay is False
    assert s.chunk_size == MemoryConfig.chunk_size
    # The config package's copy of the layer's defaults (it imports nothing of the model).
    assert MEMORY_DEFAULTS == {f.name: f.default for f in dataclasses.fields(MemoryConfig)
                               if f.name in want}
    with pytest.raises(ValueError, match="unknown memory field"):
        memory_section(dtype="float32")
    t = titans_memory_section(chunk_size=8)
    assert t.chunk_size == 8 and t.theta_max == TITANS_MEMORY["theta_max"]
    assert t.use_momentum and t.use_decay and t.use_conv and t.memory_depth == 2


def test_backbone_config_builds_tiny_and_paper_sizes():
    shapes = {s: (512 + i, 2 + i, 1024 + i) for i, s in enumerate(PAPER_SIZES)}
    memory = memory_section(head_dim=32)
    tiny = backbone_config("lmm", "", shapes, memory)
    m = tiny.model
    assert (m.name, m.size, m.d_model, m.n_layers, m.d_ff) == ("lmm", "tiny", 256, 4, 688)
    assert "n_heads" not in m and "n_persistent" not in m
    assert m.memory.head_dim == 32 and tiny.train.batch_size == 8
    big = backbone_config("lmm", "340m", shapes, memory, n_persistent=(4, 16))
    assert (big.model.d_model, big.model.n_layers, big.model.d_ff) == shapes["340m"]
    assert big.model.n_persistent == 16
    assert big.data.seq_len == 4096 and big.model.dtype == "bfloat16"
    with pytest.raises(ValueError, match="unknown lmm size '1b'"):
        backbone_config("lmm", "1b", shapes, memory)


def test_titans_config_uses_the_titans_memory():
    shapes = {s: (768, 12, 12, 2048) for s in PAPER_SIZES}
    c = titans_config("mag", "tiny", shapes)
    assert c.model.n_heads == 4 and c.model.n_persistent == 4
    assert c.model.memory.eta_max == 0.9
    assert c.model.memory.to_dict() == titans_memory_section().to_dict()
    assert titans_config("mag", "170m", shapes).model.n_persistent == 16


def test_ttt_config_short_conv_is_the_only_difference_it_makes():
    shapes = {s: (768, 12, 2048) for s in PAPER_SIZES}
    off = ttt_config("ttt_linear", "tiny", shapes, paper_base_lr=1.0, memory_depth=1)
    on = ttt_config("ttt_linear", "tiny", shapes, paper_base_lr=1.0, memory_depth=1,
                    short_conv=True)
    assert not off.model.memory.use_conv and on.model.memory.use_conv
    on.model.memory.use_conv = False
    assert on.to_dict() == off.to_dict()
    # the shipped presets: both with the convolution
    assert load_config("ttt_linear").model.memory.use_conv
    assert load_config("ttt_mlp").model.memory.use_conv


@pytest.mark.parametrize("name", sorted(MEMORY_VARIANTS))
def test_memory_variants_make_valid_titans_configs(name):
    """MIRAS' Moneta and Yaad biases and Atlas' polynomial features on a Titans backbone: the
    config validates and the layer's settings follow."""
    c = titans_config("mag", "tiny", {})
    memory_variant(c.model.memory, name)
    validate(c)
    mem = MemoryConfig.from_dict(dict(c.model.memory), d_model=c.model.d_model, n_heads=1)
    for field, value in MEMORY_VARIANTS[name].items():
        assert getattr(mem, field) == value
    with pytest.raises(ValueError, match="unknown memory variant 'memora'"):
        memory_variant(c.model.memory, "memora")


def test_the_lmms_write_is_stated_for_heads_of_64():
    """RAISED_WRITE bounds theta by 0.3 at the presets' heads of 64 and by 0.15 at Atlas' 16
    (the half bound that trained there); PRESET_WRITE undoes each of its fields."""
    lmm = load_config("lmm")
    bound = lambda m: MemoryConfig.from_dict(dict(m), d_model=64, n_heads=1).theta_bound  # noqa: E731
    assert lmm.model.memory.head_dim == 64 and bound(lmm.model.memory) == RAISED_WRITE["theta_max"]
    lmm.model.memory.head_dim = 16
    assert bound(lmm.model.memory) == RAISED_WRITE["theta_max"] / 2
    preset = titans_memory_section(**RAISED_WRITE, head_dim=16)
    preset.update(PRESET_WRITE)
    assert preset.to_dict() == titans_memory_section(head_dim=16).to_dict()
