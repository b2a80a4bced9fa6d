import dataclasses

import pytest

from titans_lm.config import base_config
from titans_lm.memory.config import MemoryConfig
from titans_lm.models.presets import (PAPER_SIZES, TITANS_ETA_MAX, TITANS_MEMORY, check_size,
                                      memory_section, set_paper_run, set_tiny_run,
                                      set_titans_memory, titans_memory_section)


def test_memory_section_has_every_switch():
    s = memory_section(head_dim=64, use_decay=False)
    want = {f.name for f in dataclasses.fields(MemoryConfig)} - {"d_model", "dtype", "param_dtype"}
    assert set(s.keys()) == want
    assert s.n_heads == 0 and s.head_dim == 64 and s.use_decay is False
    assert s.chunk_size == MemoryConfig.chunk_size
    with pytest.raises(ValueError, match="unknown memory field"):
        memory_section(dtype="float32")
    t = titans_memory_section(chunk_size=8)
    assert t.chunk_size == 8 and t.theta_max == TITANS_MEMORY["theta_max"]
    assert t.use_momentum and t.use_decay and t.use_conv and t.memory_depth == 2


def test_runs():
    c = base_config()
    set_tiny_run(c)
    assert (c.data.seq_len, c.train.batch_size, c.model.vocab_size) == (256, 16, 8192)
    for size, steps in (("170m", 28610), ("760m", 57220)):
        c = base_config()
        set_paper_run(c, size)
        assert c.data.seq_len * c.train.batch_size == 524_288 and c.train.steps == steps
        assert (c.optim.lr, c.optim.weight_decay, c.model.vocab_size) == (4e-4, 0.1, 32_000)
    with pytest.raises(ValueError, match="unknown paper size"):
        set_paper_run(base_config(), "1b")
    assert check_size("", ("tiny",) + PAPER_SIZES, "x") == "tiny"
    with pytest.raises(ValueError, match="unknown lmm size 'huge'"):
        check_size("huge", ("tiny",), "lmm")
