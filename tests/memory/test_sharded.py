"""titans_lm/memory/sharded.py: impl="pallas" runs per shard (jax.shard_map over batch rows and
memory heads) under a data/fsdp/tensor mesh, and equals the unsharded call and impl="chunked".

8 virtual CPU devices (conftest); the kernels run in Pallas' interpreter.
"""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from _memory_call import call_fresh
from _tiny_run import REPO, random_batch
from titans_lm.config import load
from titans_lm.logs import forget_warnings
from titans_lm.memory import sharded
from titans_lm.memory.config import MemoryConfig
from titans_lm.memory.layer import NeuralMemory
from titans_lm.train import sharding as shd
from titans_lm.train.state import init_state, model_fns, state_shardings
from titans_lm.train.step import _nll_sum, jit_train_step

# Tiny programs: skip LLVM's expensive optimisations, compile time dominates these tests.
FAST_COMPILE = {"xla_backend_optimization_level": 0}
MESHES = {"2x2x2": {"data": 2, "fsdp": 2, "tensor": 2},
          "2x1x4": {"data": 2, "fsdp": 1, "tensor": 4}}


def _subjaxprs(eqn):
    for v in eqn.params.values():
        for x in (v if isinstance(v, (tuple, list)) else (v,)):
            if hasattr(x, "eqns"):
                yield x
            elif hasattr(x, "jaxpr") and hasattr(x.jaxpr, "eqns"):
                yield x.jaxpr


def _primitives(jaxpr, inside=None):
    """Names of the primitives in ``jaxpr`` (recursively), or only of those nested in an
    equation of primitive ``inside``."""
    out = set()
    for eqn in jaxpr.eqns:
        if inside is None:
            out.add(eqn.primitive.name)
        for sub in _subjaxprs(eqn):
            out |= _primitives(sub, None if eqn.primitive.name == inside else inside)
    return out


def _kernel_per_shard(jaxpr) -> bool:
    """The program calls the Pallas kernel (not chunked's fallback) inside a shard_map."""
    return "pallas_call" in _primitives(getattr(jaxpr, "jaxpr", jaxpr), inside="shard_map")


# ----------------------------------------------------------------------------------- the plan
def test_plan_splits_rows_and_heads_and_falls_back_per_axis():
    mesh = shd.make_mesh(MESHES["2x2x2"]).abstract_mesh
    plan = sharded.shard_plan(mesh, batch=8, heads=2)
    assert (plan.batch_axes, plan.head_axes, plan.reasons) == (("data", "fsdp"), ("tensor",), ())
    assert sharded.layout_specs(plan, sharded.ENGINE_OPERANDS) == (
        (P(("data", "fsdp"), ("tensor",)),) * 8 + (P(("data", "fsdp")),)
        + (P(("data", "fsdp"), ("tensor",)),) * 2 + (P(),))
    # 3 heads on tensor 2 and 2 rows on data 2 x fsdp 2: those axes are left out, with reasons
    plan = sharded.shard_plan(mesh, batch=2, heads=3)
    assert (plan.batch_axes, plan.head_axes) == (("data",), ())
    assert len(plan.reasons) == 2
    assert "'fsdp'" in plan.reasons[0] and "train.batch_size" in plan.reasons[0]
    assert "model.memory.n_heads" in plan.reasons[1] and "'tensor'" in plan.reasons[1]
    assert plan.spec("row_head") == P(("data",), None)
    with pytest.raises(ValueError, match="layout kind"):
        plan.spec("rows")
    # no mesh, or one device: call the engine directly
    assert sharded.shard_plan(None, 8, 2) is None        # no mesh is set here
    assert sharded.shard_plan(shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}).abstract_mesh,
                              8, 2) is None
    assert sharded.runs_kernel("pallas") and not sharded.runs_kernel("chunked")
    assert not sharded.runs_kernel("reference")
    assert sharded.runs_kernel("auto", "gpu") and not sharded.runs_kernel("auto", "cpu")


# ------------------------------------------------------------------------- the layer, per shard
@functools.cache
def _layer_objective(impl, n_heads=2):
    cfg = MemoryConfig(d_model=16, n_heads=n_heads, head_dim=16, memory_depth=1, chunk_size=16,
                       impl=impl, theta_max=0.3, alpha_bias_init=-2.0)
    with nnx.use_eager_sharding(False):
        layer = NeuralMemory(cfg, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
    B, T = 8, 32
    x = jax.random.normal(jax.random.key(1), (B, T, 16), jnp.float32)
    seg = np.ones((B, T), np.int32)
    seg[:, 16:] = 2                                  # a second document at a chunk start
    w = jax.random.normal(jax.random.key(2), (B, T, 16), jnp.float32)

    def objective(params, x):
        y = call_fresh(nnx.merge(graphdef, params, rest), x, jnp.asarray(seg))
        return jnp.sum(y * w), y

    return jax.value_and_grad(objective, argnums=(0, 1), has_aux=True), params, x


@functools.cache
def _unsharded(n_heads):
    fn, params, x = _layer_objective("pallas", n_heads)
    with jax.default_matmul_precision("highest"):
        return jax.device_get(jax.jit(fn, compiler_options=FAST_COMPILE)(params, x))


def _close(got, want, rtol):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        scale = max(float(np.max(np.abs(w))), 1e-30)
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=0, atol=rtol * scale)


# 2x2x2: rows over data and fsdp, heads over tensor; 2x1x4: the fallback (2 heads, tensor 4)
@pytest.mark.parametrize("mesh_name", ["2x2x2", "2x1x4"])
def test_layer_forward_and_grads_per_shard_equal_the_unsharded_call(mesh_name, caplog):
    """The layer's output and the gradients with respect to its parameters and input, jitted
    under the mesh (x split over the batch axes) equal the call without a mesh; 2 heads on
    tensor 4 exercise the fallback (heads whole on each device, gradients still exact)."""
    n_heads = 2
    fn, params, x = _layer_objective("pallas", n_heads)
    with jax.default_matmul_precision("highest"):
        want = _unsharded(n_heads)
        mesh = shd.make_mesh(MESHES[mesh_name])
        x_sh = NamedSharding(mesh, P(shd.BATCH_AXES))
        mapped = jax.jit(shd.traced_under(mesh, fn), in_shardings=(shd.replicated(mesh), x_sh),
                         compiler_options=FAST_COMPILE)
        assert _kernel_per_shard(mapped.trace(params, x).jaxpr)
        direct = _primitives(jax.jit(fn).trace(params, x).jaxpr.jaxpr)   # no mesh: called directly
        assert "pallas_call" in direct and "shard_map" not in direct
        with caplog.at_level(logging.WARNING, logger="titans_lm.memory.sharded"):
            forget_warnings()
            got = mapped(params, jax.device_put(x, x_sh))
    _close(got, want, 1e-5)
    assert ("model.memory.n_heads" in caplog.text) == (mesh_name == "2x1x4")


# ------------------------------------------------------------------- the sharded train step
def _lmm_config(impl):
    cfg = load(REPO / "configs" / "lmm.py", "tiny")
    m = cfg.model
    m.vocab_size, m.d_model, m.n_layers, m.d_ff = 64, 32, 1, 64
    m.memory.head_dim, m.memory.memory_depth, m.memory.impl = 16, 1, impl   # 2 heads
    m.memory.theta_max = 0.05     # livelier writes than the default, so the memory matters
    m.memory.decay_target = "zero"   # the kernel's decay (toward W0 runs chunked)
    m.memory.surprise_max_norm = 0.0   # the kernel has no surprise clip
    return cfg


def _loss_and_grads(impl, mesh, batch):
    """(loss, grads) of the train step's objective, jitted with the trainer's shardings and
    traced under the mesh (as jit_train_step)."""
    cfg = _lmm_config(impl)
    fns = model_fns(cfg.model)
    tx = optax.sgd(1.0)
    state = init_state(cfg.model, fns, tx, mesh, seed=0)
    state_sh = state_shardings(fns, tx, mesh)

    def f(params, batch):
        (nll, (n, _)), grads = jax.value_and_grad(_nll_sum, has_aux=True)(params, batch, fns,
                                                                           jnp.float32)
        return nll / n, jax.tree.map(lambda g: g / n, grads)

    jf = jax.jit(shd.traced_under(mesh, f),
                 in_shardings=(state_sh.params, shd.batch_sharding(mesh)),
                 compiler_options=FAST_COMPILE)
    out = jf(state.params, shd.put_batch(batch, mesh))
    return jax.device_get(out), fns, tx, state, state_sh


@pytest.mark.kernel
@pytest.mark.parametrize("mesh_name", ["2x2x2"])
def test_sharded_train_step_with_pallas_equals_chunked(mesh_name):
    """A tiny LMM (persistent tokens, conv, momentum, decay, two documents per row): loss and
    gradients with impl="pallas" per shard under the mesh equal impl="chunked" on the same mesh;
    jit_train_step's program runs the kernel under shard_map."""
    mesh = shd.make_mesh(MESHES[mesh_name])
    batch = random_batch(8, 32, vocab=64)
    batch["segment_ids"][:, 16:] = np.where(batch["segment_ids"][:, 16:] == 1, 2,
                                            batch["segment_ids"][:, 16:])
    with jax.default_matmul_precision("highest"):
        (loss_p, g_p), fns, tx, state, state_sh = _loss_and_grads("pallas", mesh, batch)
        (loss_c, g_c), *_ = _loss_and_grads("chunked", mesh, batch)
        step = jit_train_step(fns, tx, optax.constant_schedule(1.0), state_sh, mesh)
        jaxpr = step.trace(state, shd.put_batch(batch, mesh)).jaxpr
    assert _kernel_per_shard(jaxpr)
    np.testing.assert_allclose(loss_p, loss_c, rtol=1e-5)
    # float32: a gate bias's gradient is a sum over 256 tokens with cancellation (alpha_b,
    # ~1e-6, differed by 4.7e-5 of its largest element in one run of the suite)
    _close(g_p, g_c, 1e-4)
    assert max(float(np.max(np.abs(g))) for g in jax.tree.leaves(g_p)) > 0
