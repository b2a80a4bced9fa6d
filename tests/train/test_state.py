"""Train state: the abstract model description, parameter application, abstract restore targets."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from _tiny_run import random_batch, tiny_config
from titans_lm.models import build_model
from titans_lm.models import count_params as model_count_params
from titans_lm.train import sharding as shd
from titans_lm.train.optimizer import make_optimizer
from titans_lm.train.state import abstract_state, count_params, init_state, model_fns


def test_model_fns_describe_and_apply_the_model(tmp_path):
    cfg = tiny_config(tmp_path)
    fns = model_fns(cfg.model)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(fns.abstract_params()))
    model = build_model(cfg.model, rngs=nnx.Rngs(0))
    assert count_params(fns) == model_count_params(model)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    b = random_batch(2, 64)
    x, s = jnp.asarray(b["tokens"][:, :-1]), jnp.asarray(b["segment_ids"][:, :-1])
    logits, state = fns.apply(params, x, s, fns.init_state(params, 2))
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(model(x, s)))
    ref_logits, ref_state = model(x, s, model.init_state(2))
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(ref_logits))
    assert jax.tree.structure(state) == jax.tree.structure(ref_state) and not state.fresh
    assert fns.logical_axes["embed"]["embedding"] == jax.sharding.PartitionSpec("vocab", "embed")


def test_init_state_and_abstract_target_agree(tmp_path):
    cfg = tiny_config(tmp_path)
    fns = model_fns(cfg.model)
    tx, _ = make_optimizer(cfg.optim, 10)
    mesh = shd.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    state = init_state(cfg.model, fns, tx, mesh, seed=3)
    target = abstract_state(fns, tx, mesh)
    assert jax.tree.structure(state) == jax.tree.structure(target)
    for x, t in zip(jax.tree.leaves(state), jax.tree.leaves(target)):
        assert x.shape == t.shape and x.dtype == t.dtype and x.sharding == t.sharding
    assert int(state.step) == 0 and state.rng.shape == (2,) and state.rng.dtype == jnp.uint32
    other = init_state(cfg.model, fns, tx, mesh, seed=4)
    assert not np.array_equal(np.asarray(state.params["embed"]["embedding"]),
                              np.asarray(other.params["embed"]["embedding"]))
