"""configs/swa.py: the sliding-window-only Transformer++ control."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.config import load_module, validate
from titans_lm.train.optimizer import make_optimizer
from titans_lm.train.state import init_state, model_fns
from titans_lm.train import sharding as shd
from titans_lm.train.step import train_step

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _load(name):
    return load_module(CONFIGS / f"{name}.py")


def _small(window=8, n_layers=1):
    c = _load("swa").get_config("tiny")
    c.model.update(d_model=32, n_layers=n_layers, n_heads=2, d_ff=64, vocab_size=64, window=window)
    c.data.vocab_size = 64
    return c


def test_window_matches_the_hybrids():
    swa, mag, mal = (_load(n).get_config("tiny") for n in ("swa", "mag", "mal"))
    validate(swa)
    assert swa.model.name == "transformer" and swa.model.window == mag.model.window == \
        mal.model.window == 64
    assert _load("transformer").get_config("tiny").model.window == 0
    assert _load("swa").get_config("125m").model.window == 1024


def test_causal_within_the_window():
    from flax import nnx

    from titans_lm.models import build_model
    cfg = _small(window=8)
    with nnx.use_eager_sharding(False):
        model = build_model(cfg.model, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    run = jax.jit(lambda x, g: nnx.merge(graphdef, state)(x, g))
    rng = np.random.default_rng(0)
    x = rng.integers(4, 64, (1, 40)).astype(np.int32)
    seg = np.ones_like(x)
    base = np.asarray(run(x, seg))
    t = 30
    for s, visible in ((t - 8, False), (t - 7, True), (t, True), (t + 1, False)):
        y = x.copy()
        y[0, s] = (y[0, s] + 1 - 4) % 60 + 4
        changed = np.abs(np.asarray(run(y, seg))[0, t] - base[0, t]).max() > 1e-6
        assert changed == visible, (s, visible)


@pytest.mark.slow
def test_trains_one_step():
    cfg = _small(window=8, n_layers=2)
    fns = model_fns(cfg.model)
    mesh = shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 1})
    tx, sched = make_optimizer(cfg.optim, 10)
    state = init_state(cfg.model, fns, tx, mesh, 0)
    rng = np.random.default_rng(0)
    tokens = rng.integers(4, 64, (2, 33)).astype(np.int32)
    batch = {"tokens": jnp.asarray(tokens), "segment_ids": jnp.ones_like(tokens)}
    new, metrics = jax.jit(lambda s, b: train_step(s, b, fns=fns, tx=tx, schedule=sched))(state,
                                                                                         batch)
    assert np.isfinite(float(metrics["loss"])) and int(new.step) == 1
    assert any(float(jnp.abs(a - b).max()) > 0 for a, b in zip(jax.tree.leaves(new.params),
                                                               jax.tree.leaves(state.params)))
