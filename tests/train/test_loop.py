"""The training loop: exact resume, logging, validation, non-finite loss, config checks (a stop by
signal and its resume: tests/train/test_integrity.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _tiny_run import tiny_config, tree_max_abs_diff
from titans_lm.train import sharding as shd
from titans_lm.train import step as step_module
from titans_lm.train.checkpoint import Checkpointer
from titans_lm.train.loop import NonFiniteLossError, check_train_config, train
from titans_lm.train.optimizer import make_optimizer
from titans_lm.train.state import abstract_state, model_fns
from titans_lm.train.writers import read_metrics

pytestmark = pytest.mark.e2e


def _final_state(cfg, workdir):
    fns = model_fns(cfg.model)
    tx, _ = make_optimizer(cfg.optim, cfg.train.steps)
    with Checkpointer(workdir) as ck:
        state, data_state, step = ck.restore(abstract_state(fns, tx, shd.make_mesh(cfg.mesh)))
    return jax.device_get(state), data_state, step


def test_resume_is_exact(tmp_path):
    cfg = tiny_config(tmp_path / "cache", train__steps=6, train__ckpt_every=100, train__eval_every=4)
    straight = train(cfg, tmp_path / "a", progress=False)
    assert straight.status == "completed" and sorted(straight.losses) == [1, 2, 3, 4, 5, 6]
    first = train(cfg, tmp_path / "b", stop_at_step=3, progress=False)
    assert first.status == "stopped" and first.step == 3
    second = train(cfg, tmp_path / "b", progress=False)  # new manager, iterator restored
    assert second.status == "completed" and sorted(second.losses) == [4, 5, 6]
    resumed = {**first.losses, **second.losses}
    assert resumed == straight.losses  # bit-identical losses
    assert second.val_losses == straight.val_losses  # validation at step 4 (and the end, 6)
    sa, da, _ = _final_state(cfg, tmp_path / "a")
    sb, db, _ = _final_state(cfg, tmp_path / "b")
    assert tree_max_abs_diff(sa, sb) == 0.0 and da == db
    # metrics.jsonl holds each step once, train records every step, validation at 4 and 6
    recs = read_metrics(tmp_path / "b")
    assert [r["step"] for r in recs if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in recs if "val_loss" in r] == [4, 6]
    assert {"loss", "grad_norm", "lr", "tokens", "tokens_per_sec", "tokens_seen", "mfu"} <= set(recs[0])
    B, T = cfg.train.batch_size, cfg.data.seq_len
    assert [r["tokens_seen"] for r in recs if "loss" in r] == [s * B * T for s in range(1, 7)]
    assert all(0 < r["mfu"] for r in recs if "loss" in r)
    assert all(r["val_tokens_per_sec"] > 0 for r in recs if "val_loss" in r)
    assert [r["step"] for r in recs if r.get("event") == "resume"] == [3]
    assert list((tmp_path / "b" / "tb").glob("events.out.tfevents.*"))
    # already finished: a third call does nothing
    assert train(cfg, tmp_path / "b", progress=False).losses == {}


def test_non_finite_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(
        tmp_path, monkeypatch):
    original = step_module.train_step

    def poisoned(state, batch, **kw):  # the update producing state 5 yields NaN loss and params
        new, metrics = original(state, batch, **kw)
        bad = state.step + 1 == 5
        metrics = {**metrics, "loss": jnp.where(bad, jnp.nan, metrics["loss"])}
        params = jax.tree.map(lambda p: jnp.where(bad, jnp.nan, p), new.params)
        return new.replace(params=params), metrics

    monkeypatch.setattr(step_module, "train_step", poisoned)
    cfg = tiny_config(tmp_path / "cache", train__steps=8, train__ckpt_every=2)
    with pytest.raises(NonFiniteLossError) as e:
        train(cfg, tmp_path / "run", progress=False)
    msg = str(e.value)
    assert "non-finite loss (nan) at step 5" in msg
    assert "last good checkpoint (step 4)" in msg
    with Checkpointer(tmp_path / "run") as ck:
        assert ck.steps() == [2, 4]
    state, _, step = _final_state(cfg, tmp_path / "run")
    assert step == 4 and all(np.isfinite(x).all() for x in jax.tree.leaves(state.params))


def test_config_checks_name_the_fields(tmp_path):
    with pytest.raises(ValueError, match="data.vocab_size=320 and model.vocab_size=512 must agree"):
        check_train_config(tiny_config(tmp_path, model__vocab_size=512))
    with pytest.raises(ValueError, match="train.grad_accum"):
        check_train_config(tiny_config(tmp_path, train__grad_accum=3))
    cfg = tiny_config(tmp_path, train__batch_size=4, mesh__data=8)
    with pytest.raises(ValueError, match="multiple of mesh data\\*fsdp = 8"):
        train(cfg, tmp_path / "run", progress=False)
