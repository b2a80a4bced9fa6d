"""Mesh, logical-axis rules and sharded training (8 virtual CPU devices from conftest)."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from _tiny_run import random_batch, tiny_config, tree_max_abs_diff
from titans_lm.train import sharding as shd
from titans_lm.train.optimizer import make_optimizer
from titans_lm.train.state import init_state, model_fns, state_shardings
from titans_lm.train.step import jit_train_step


def test_mesh_shape_resolves_minus_one_and_rejects_bad_sizes():
    assert shd.mesh_shape({"data": -1, "fsdp": 2, "tensor": 1}, 8) == (4, 2, 1)
    assert shd.mesh_shape({"data": 1, "fsdp": 1, "tensor": -1}, 8) == (1, 1, 8)
    assert shd.mesh_shape({"data": 2, "fsdp": 1, "tensor": 1}, 8) == (2, 1, 1)  # subset of devices
    with pytest.raises(ValueError, match="at most one axis"):
        shd.mesh_shape({"data": -1, "fsdp": -1, "tensor": 1}, 8)
    with pytest.raises(ValueError, match="does not divide"):
        shd.mesh_shape({"data": -1, "fsdp": 3, "tensor": 1}, 8)
    with pytest.raises(ValueError, match="only 8 devices"):
        shd.mesh_shape({"data": 4, "fsdp": 4, "tensor": 1}, 8)


def test_make_mesh_axes_are_auto():
    mesh = shd.make_mesh({"data": 4, "fsdp": 1, "tensor": 2})
    assert mesh.axis_names == shd.MESH_AXES and dict(mesh.shape) == {"data": 4, "fsdp": 1, "tensor": 2}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)
    assert shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}).size == 1


def test_logical_rules_map_and_fall_back():
    mesh = shd.make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    assert shd.logical_to_mesh_spec(("embed", "mlp"), (32, 64), mesh) == P("fsdp", "tensor")
    assert shd.logical_to_mesh_spec(("vocab", "embed"), (320, 32), mesh) == P("tensor", "fsdp")
    spec = shd.logical_to_mesh_spec(("embed", "heads", "head_dim"), (32, 2, 16), mesh)
    assert spec == P("fsdp", "tensor", None)
    # 6 is not divisible by fsdp=4 -> that dimension is replicated
    assert shd.logical_to_mesh_spec(("embed", "mlp"), (6, 64), mesh) == P(None, "tensor")
    # a mesh axis is used once per parameter: the second "tensor" dimension is replicated
    assert shd.logical_to_mesh_spec(("vocab", "mlp"), (8, 8), mesh) == P("tensor", None)
    # annotation whose rank differs from the parameter: replicated whole
    assert shd.logical_to_mesh_spec(("embed",), (8, 8), mesh) == P()
    assert shd.logical_to_mesh_spec((), (8,), mesh) == P()
    with pytest.raises(ValueError, match="'bogus' has no rule"):
        shd.logical_to_mesh_spec(("bogus",), (8,), mesh)


def test_batch_sharding_splits_rows_over_data_and_fsdp():
    mesh = shd.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    assert shd.batch_divisor(mesh) == 4
    b = shd.put_batch(random_batch(8, 64), mesh)
    assert b["tokens"].sharding.spec == P(("data", "fsdp"))
    assert b["tokens"].addressable_shards[0].data.shape == (2, 65)


def test_process_rows_is_this_process_block_and_put_global_batch_is_the_whole_batch(monkeypatch):
    batch = random_batch(8, 64)
    monkeypatch.setattr(jax, "process_count", lambda: 4)
    monkeypatch.setattr(jax, "process_index", lambda: 2)
    np.testing.assert_array_equal(shd.process_rows(batch)["tokens"], batch["tokens"][4:6])
    monkeypatch.undo()
    mesh = shd.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    whole = shd.put_global_batch(batch, mesh)  # one process: its rows are all rows
    assert whole["tokens"].sharding.spec == P(("data", "fsdp"))
    np.testing.assert_array_equal(np.asarray(whole["segment_ids"]), batch["segment_ids"])


def _run_steps(cfg, mesh, batches):
    fns = model_fns(cfg.model)
    tx, sched = make_optimizer(cfg.optim, cfg.train.steps)
    state = init_state(cfg.model, fns, tx, mesh, seed=0)
    init_params = jax.device_get(state.params)
    step = jit_train_step(fns, tx, sched, state_shardings(fns, tx, mesh), mesh)
    losses = []
    for b in batches:
        state, m = step(state, shd.put_batch(b, mesh))
        losses.append(float(m["loss"]))
    return losses, jax.device_get(state.params), state, init_params


@pytest.fixture(scope="module")
def one_device_run(tmp_path_factory):
    cfg = tiny_config(tmp_path_factory.mktemp("cache"), optim__lr=1e-3)
    batches = [random_batch(8, 64, seed=i) for i in range(3)]
    return cfg, batches, _run_steps(cfg, shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}), batches)


@pytest.mark.parametrize("mesh_cfg", [{"data": 4, "fsdp": 1, "tensor": 2},
                                      {"data": 1, "fsdp": 8, "tensor": 1}])
def test_sharded_training_matches_one_device(one_device_run, mesh_cfg):
    cfg, batches, (ref_losses, ref_params, _, init_params) = one_device_run
    losses, params, state, _ = _run_steps(cfg, shd.make_mesh(mesh_cfg), batches)
    np.testing.assert_allclose(losses, ref_losses, rtol=0, atol=1e-5)
    assert tree_max_abs_diff(params, ref_params) < 1e-5
    assert tree_max_abs_diff(params, init_params) > 1e-4  # the steps did move the parameters
    # parameters really are split across devices by the rules, and the moments follow them
    axis = "tensor" if mesh_cfg["tensor"] > 1 else "fsdp"
    assert any(axis in str(x.sharding.spec) for x in jax.tree.leaves(state.params))
    assert any(axis in str(x.sharding.spec) for x in jax.tree.leaves(state.opt_state) if x.ndim >= 2)
