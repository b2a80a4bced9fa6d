"""Checkpoints: round trip with resharding, async save + wait, retention, config check,
half-written and corrupt checkpoints."""

import shutil

import jax
import numpy as np
import pytest

from _tiny_run import tiny_config, tree_max_abs_diff
from titans_lm.train import sharding as shd
from titans_lm.config.compat import config_differences
from titans_lm.train.checkpoint import Checkpointer, CheckpointError
from titans_lm.train.optimizer import make_optimizer
from titans_lm.train.state import abstract_state, init_state, model_fns


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint at step 3 written from a (data 4, tensor 2) mesh."""
    root = tmp_path_factory.mktemp("ckpt")
    cfg = tiny_config(root / "cache")
    fns = model_fns(cfg.model)
    tx, _ = make_optimizer(cfg.optim, cfg.train.steps)
    state = init_state(cfg.model, fns, tx, shd.make_mesh({"data": 4, "fsdp": 1, "tensor": 2}), seed=0)
    host = jax.device_get(state)
    with Checkpointer(root / "run", keep=2) as ck:
        assert ck.save(3, state, {"next_index": np.int64(24), "blob": b"\x00\xff"}, cfg)
        assert not ck.save(3, state, None, cfg)  # a step is saved once
        ck.wait()  # async save: complete on disk after wait
    return root / "run", cfg, fns, tx, host


def test_round_trip_onto_another_mesh(saved):
    workdir, cfg, fns, tx, host = saved
    mesh1 = shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 1})
    with Checkpointer(workdir) as ck:
        assert ck.steps() == [3] and ck.latest_step() == 3
        state, data_state, step = ck.restore(abstract_state(fns, tx, mesh1))
        assert step == 3 and data_state == {"next_index": 24, "blob": b"\x00\xff"}
        assert tree_max_abs_diff(state, host) == 0.0
        assert all(x.sharding.mesh == mesh1 for x in jax.tree.leaves(state))
        params, _ = ck.restore_params(abstract_state(fns, tx, mesh1).params)
        assert tree_max_abs_diff(params, host.params) == 0.0
        assert ck.read_config().model.d_model == cfg.model.d_model
        ck.check_config(cfg)  # same config: accepted


def test_mismatched_model_config_is_refused_naming_fields(saved):
    workdir, cfg, *_ = saved
    other = tiny_config("/elsewhere", model__d_model=64)  # cache_dir differs too: allowed
    with Checkpointer(workdir) as ck:
        with pytest.raises(CheckpointError) as e:
            ck.check_config(other)
    msg = str(e.value)
    assert msg.startswith(f"cannot resume {workdir}: its checkpoint (step 3) was written with a "
                          "different configuration.")
    assert "\n  model.d_model: 32 -> 64\n" in msg and "Use a new --workdir" in msg
    assert "cache_dir" not in msg
    diffs = config_differences(cfg.to_dict(), tiny_config("/x", train__steps=99, data__seq_len=128))
    assert [d[0] for d in diffs] == ["data.seq_len"]  # steps may change on resume; seq_len may not


def test_half_written_checkpoint_is_ignored(saved, tmp_path):
    workdir, cfg, fns, tx, host = saved
    run = tmp_path / "run"
    shutil.copytree(workdir, run)
    tmp = run / "checkpoints" / "6.orbax-checkpoint-tmp-1234"  # a save cut short
    (tmp / "state").mkdir(parents=True)
    (tmp / "state" / "garbage").write_bytes(b"\x00" * 10)
    with Checkpointer(run) as ck:
        assert ck.latest_step() == 3
        mesh = shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 1})
        state, _, step = ck.restore(abstract_state(fns, tx, mesh))
    assert step == 3 and tree_max_abs_diff(state, host) == 0.0


def test_corrupt_checkpoint_gives_clear_error_and_deletes_nothing(saved, tmp_path):
    workdir, cfg, fns, tx, _ = saved
    run = tmp_path / "run"
    shutil.copytree(workdir, run)
    step_dir = run / "checkpoints" / "3"
    for f in (step_dir / "state").rglob("*"):
        if f.is_file():
            f.write_bytes(b"not a checkpoint")
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    with Checkpointer(run) as ck:
        with pytest.raises(CheckpointError, match=r"checkpoint .*checkpoints/3 could not be read .*"
                                                  r"Nothing was deleted"):
            ck.restore(abstract_state(fns, tx, shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 1})))
    (step_dir / "config").rename(step_dir / "config.moved")
    with Checkpointer(run) as ck:
        with pytest.raises(CheckpointError, match="could not be read"):
            ck.check_config(cfg)
    (step_dir / "config.moved").rename(step_dir / "config")
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def test_retention_keeps_the_newest(saved, tmp_path):
    workdir, cfg, fns, tx, host = saved
    with Checkpointer(workdir) as ck:
        state, _, _ = ck.restore(abstract_state(fns, tx, shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 1})))
    with Checkpointer(tmp_path / "run", keep=2) as ck:
        for s in (1, 2, 3):
            ck.save(s, state, {"i": s}, cfg)
        ck.wait()
        assert ck.steps() == [2, 3]
    with pytest.raises(CheckpointError, match="no checkpoint for step 7 .* available: \\[2, 3\\]"):
        Checkpointer(tmp_path / "run", read_only=True).resolve_step(7)
    with pytest.raises(CheckpointError, match="no checkpoints in"):
        Checkpointer(tmp_path / "nothing", read_only=True)
