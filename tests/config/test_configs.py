"""configs/transformer.py: every size builds, with logical axes, near its name's parameter count."""

import re
from pathlib import Path

import pytest
from absl import flags
from flax import nnx

from titans_lm.config import load_module, validate
from titans_lm.config.flag import define_config_flag
from titans_lm.models import build_model, count_params
from titans_lm.nn.init import AXIS_NAMES

CONFIG_PATH = Path(__file__).resolve().parents[2] / "configs" / "transformer.py"


MOD = load_module(CONFIG_PATH)


def _abstract(cfg):
    with nnx.use_eager_sharding(False):
        return nnx.eval_shape(lambda: build_model(cfg.model, rngs=nnx.Rngs(0)))


def _analytic_count(m):
    D, F, V, L = m.d_model, m.d_ff, m.vocab_size, m.n_layers
    emb = V * D * (1 if m.tie_embeddings else 2)
    return emb + L * (4 * D * D + 3 * D * F + 2 * D) + D


@pytest.mark.parametrize("size", MOD.SIZES)
def test_each_size_builds_abstractly_with_logical_axes(size):
    cfg = MOD.get_config(size)
    validate(cfg)
    assert cfg.model.name == "transformer"
    assert cfg.model.vocab_size == cfg.data.vocab_size
    model = _abstract(cfg)
    n = count_params(model)
    assert n == _analytic_count(cfg.model)
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        names = var.get_metadata().get("out_sharding")
        assert names is not None and len(names) == len(var.shape), path
        assert all(a is None or a in AXIS_NAMES for a in names), (path, names)
    m = re.fullmatch(r"(\d+)m", size)
    if m:
        target = int(m.group(1)) * 1e6
        assert abs(n - target) / target < 0.10, (size, n)
        assert cfg.train.batch_size * cfg.data.seq_len == 524_288
        assert cfg.data.seq_len == 4096 and cfg.model.vocab_size == 32_000
        assert cfg.optim.lr == 4e-4 and cfg.optim.weight_decay == 0.1 and cfg.optim.b2 == 0.95
        assert 0 < cfg.optim.warmup_steps <= cfg.train.steps // 10


def test_tiny_size_shapes():
    cfg = MOD.get_config("tiny")
    m = cfg.model
    assert (m.d_model, m.n_layers, m.n_heads, m.vocab_size, m.tie_embeddings) == (256, 4, 4, 8192, True)
    assert (cfg.train.batch_size, cfg.data.seq_len) == (8, 256)
    assert MOD.get_config().model.d_model == 256


def test_invalid_size_lists_valid_ones():
    with pytest.raises(ValueError, match=r"'1b'.*tiny.*125m.*340m.*760m"):
        MOD.get_config("1b")


def test_loads_through_config_flags_with_overrides():
    argv = ["prog", f"--config={CONFIG_PATH}:340m", "--config.model.window=512",
            "--config.model.remat=none"]
    fv = flags.FlagValues()
    define_config_flag("config", "config file", flag_values=fv, sys_argv=argv)
    fv(argv)
    cfg = fv.config
    assert cfg.model.d_model == 1024 and cfg.model.window == 512 and cfg.model.remat == "none"
    assert cfg.train.batch_size == 128
