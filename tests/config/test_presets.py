"""The run presets of the config files: the tiny run, the Titans paper's run, sizes."""

import pytest

from titans_lm.config import base_config
from titans_lm.config.presets import (PAPER_SIZES, TINY_SHAPE, check_size, set_paper_run,
                                      set_shell, set_tiny_run)


def test_runs():
    c = base_config()
    set_tiny_run(c)
    assert (c.data.seq_len, c.train.batch_size, c.model.vocab_size) == (256, 8, 8192)
    assert (c.train.steps, c.optim.lr) == (800, 2e-3)
    for size, steps in (("170m", 28610), ("760m", 57220)):
        c = base_config()
        set_paper_run(c, size)
        assert c.data.seq_len * c.train.batch_size == 524_288 and c.train.steps == steps
        assert (c.optim.lr, c.optim.weight_decay, c.model.vocab_size) == (4e-4, 0.1, 32_000)
    with pytest.raises(ValueError, match="unknown paper size"):
        set_paper_run(base_config(), "1b")
    c = base_config()
    set_paper_run(c, "125m", train_tokens=2_500_000_000)
    assert c.train.steps == 2_500_000_000 // 524_288
    assert check_size("", ("tiny",) + PAPER_SIZES, "x") == "tiny"
    with pytest.raises(ValueError, match="unknown lmm size 'huge'"):
        check_size("huge", ("tiny",), "lmm")


def test_shell_and_tiny_shape():
    c = base_config()
    set_shell(c.model, "lmm", "tiny")
    assert (c.model.name, c.model.size, c.model.param_dtype) == ("lmm", "tiny", "float32")
    assert TINY_SHAPE == {"d_model": 256, "n_layers": 4, "n_heads": 4, "d_ff": 688}
