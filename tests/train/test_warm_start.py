from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.config import load
from titans_lm.data import tasks as data_tasks
from titans_lm.train.checkpoint import Checkpointer, CheckpointError
from titans_lm.train.loop import train
from titans_lm.train.state import model_fns
from titans_lm.train.step import _nll_sum
from titans_lm.train.warm_start import warm_start_params

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
QUIET = dict(progress=False, log=lambda m: None)


def _cfg(seq_len=64, **model):
    c = load(Path(__file__).resolve().parents[2] / "configs" / "tasks" / "mqar.py",
             "transformer")
    c.data.vocab_size = 1024
    c.data.seq_len = seq_len
    c.model.update({**dict(d_model=32, n_layers=1, n_heads=2, d_ff=64), **model})
    c.train.update(steps=2, batch_size=4, log_every=1, eval_every=2, eval_batches=1, ckpt_every=1)
    c.optim.warmup_steps = 1
    c.mesh.data = 1
    c.task.update(train_pairs=(4, 8))
    return c


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    d = tmp_path_factory.mktemp("warm") / "short"
    train(_cfg(), d, **QUIET)
    return d


def test_a_longer_context_starts_from_the_source_parameters(source, tmp_path):
    cfg = _cfg(seq_len=128)
    cfg.train.init_from = str(source)
    warm = train(cfg, tmp_path / "long", **QUIET)
    fns = model_fns(cfg.model)
    with Checkpointer(source, read_only=True) as ck:
        params, step = ck.restore_params(fns.abstract_params())
    assert step == 2
    # Step 1's loss is taken before the first update: the source's parameters on this run's
    # first batch (its own data, at its own length).
    batch = next(data_tasks.TaskData.from_config(cfg).train_iterator(
        seq_len=128, batch_size=4, seed=cfg.data.shuffle_seed))
    nll, (n, _) = _nll_sum(params, jax.tree.map(jnp.asarray, batch), fns, jnp.float32)
    np.testing.assert_allclose(warm.losses[1], float(nll / n), rtol=1e-5)
    cold = train(_cfg(seq_len=128), tmp_path / "cold", **QUIET)
    assert abs(cold.losses[1] - warm.losses[1]) > 1e-3  # the seed's parameters differ
    # A run with a checkpoint of its own resumes from it and ignores init_from.
    cfg.train.init_from = str(tmp_path / "no such run")
    cfg.train.steps = 3
    assert list(train(cfg, tmp_path / "long", **QUIET).losses) == [3]


def test_a_missing_run_or_another_shape_is_named(source, tmp_path):
    cfg = _cfg()
    cfg.train.init_from = str(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="train.init_from: no checkpoints in"):
        train(cfg, tmp_path / "a", **QUIET)
    wide = _cfg(d_ff=96)
    wide.train.init_from = str(source)
    with pytest.raises(CheckpointError, match=r"do not fit this model; model fields that differ "
                       r"\(checkpoint -> config\): model.d_ff: 64 -> 96"):
        train(wide, tmp_path / "b", **QUIET)
    abstract = model_fns(_cfg().model).abstract_params()
    np.testing.assert_array_equal(  # the same leaves as a plain restore
        jax.tree.leaves(warm_start_params(source, abstract, _cfg(), lambda m: None))[0],
        jax.tree.leaves(_restore(source, abstract))[0])


def _restore(workdir, abstract):
    with Checkpointer(workdir, read_only=True) as ck:
        return ck.restore_params(abstract)[0]
