"""The pure train step: loss definition, gradient accumulation, bf16 compute, eval step."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from _tiny_run import random_batch, tiny_config, tree_max_abs_diff
from titans_lm.train import sharding as shd
from titans_lm.train.optimizer import make_optimizer
from titans_lm.train.state import abstract_state, init_state, model_fns, state_shardings
from titans_lm.train.step import eval_step, jit_eval_step, jit_train_step, split_batch


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    cfg = tiny_config(tmp_path_factory.mktemp("cache"), optim__lr=1e-3, optim__warmup_steps=0)
    mesh = shd.make_mesh({"data": 1, "fsdp": 1, "tensor": 1})
    fns = model_fns(cfg.model)
    tx, sched = make_optimizer(cfg.optim, cfg.train.steps)
    return cfg, mesh, fns, tx, sched


def _reference_nll(fns, params, batch):
    """float64 numpy: summed nll over the contract's weights, and the weight count."""
    tokens, segs = batch["tokens"], batch["segment_ids"]
    logits = np.asarray(fns.apply(params, jnp.asarray(tokens[:, :-1]), jnp.asarray(segs[:, :-1]),
                                  fns.init_state(params, tokens.shape[0]))[0], np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    tgt = tokens[:, 1:]
    nll = -np.take_along_axis(logp, tgt[..., None], -1)[..., 0]
    w = (segs[:, 1:] == segs[:, :-1]) & (segs[:, 1:] != 0)
    return float((nll * w).sum()), int(w.sum())


def test_split_batch_weights_follow_the_contract():
    b = random_batch(2, 64)
    inputs, targets, seg_in, w = split_batch(b)
    assert inputs.shape == targets.shape == (2, 64)
    w = np.asarray(w)
    assert w[0, 30] == 1 and w[0, 31] == 0  # target 32 starts document 2: not scored
    assert w[0, 32] == 1 and w[0, -6] == 1 and w[0, -5] == 0 and w[0, -1] == 0  # padding not scored
    assert w.sum() == 2 * (64 - 1 - 5)


@pytest.fixture(scope="module")
def fp32_step(setup):
    """One float32 Adam step on a fixed batch: (initial params, batch, new state, metrics, step fn)."""
    cfg, mesh, fns, tx, sched = setup
    state = init_state(cfg.model, fns, tx, mesh, seed=0)
    params0 = jax.device_get(state.params)
    batch = random_batch(8, 64, seed=1)
    step = jit_train_step(fns, tx, sched, state_shardings(fns, tx, mesh), mesh)
    state, m = step(state, shd.put_batch(batch, mesh))
    return params0, batch, state, jax.device_get(m), step


def test_loss_metrics_and_eval_step_match_reference(setup, fp32_step):
    cfg, mesh, fns, tx, sched = setup
    params0, batch, state, m, step = fp32_step
    nll, n = _reference_nll(fns, params0, batch)
    s_nll, s_n = eval_step(params0, batch, fns=fns)
    np.testing.assert_allclose(float(s_nll), nll, rtol=1e-5)
    assert int(s_n) == n
    e_nll, e_n = jit_eval_step(fns, state_shardings(fns, tx, mesh).params, mesh)(
        params0, shd.put_batch(batch, mesh))
    np.testing.assert_allclose(float(e_nll), nll, rtol=1e-5)
    np.testing.assert_allclose(float(m["loss"]), nll / n, rtol=1e-5)
    assert float(m["tokens"]) == n
    np.testing.assert_allclose(float(m["lr"]), float(sched(0)), rtol=1e-6)
    assert int(state.step) == 1 and float(m["grad_norm"]) > 0
    # all-padding batch: loss 0, finite, nothing scored
    empty = {k: np.zeros_like(v) for k, v in batch.items()}
    state, m2 = step(jax.tree.map(lambda x: x.copy(), state), shd.put_batch(empty, mesh))
    assert float(m2["loss"]) == 0.0 and float(m2["tokens"]) == 0.0


def test_gradient_accumulation_equals_one_big_batch(setup):
    # Plain SGD with rate 1: the update *is* the gradient, so parameters compare gradients
    # directly (Adam's first step, g / |g|, would magnify rounding in near-zero components).
    cfg, mesh, fns, _, _ = setup
    tx, sched = optax.sgd(1.0), optax.constant_schedule(1.0)
    batch = random_batch(8, 64, seed=2)
    batch["segment_ids"][:3, 50:] = 0  # uneven weights between micro-batches
    batch["tokens"][:3, 50:] = 0
    out = {}
    state0 = init_state(cfg.model, fns, tx, mesh, seed=0)
    for accum in (1, 2):
        state = jax.tree.map(lambda x: x.copy(), state0)  # the step donates its input
        step = jit_train_step(fns, tx, sched, state_shardings(fns, tx, mesh), mesh, grad_accum=accum)
        state, m = step(state, shd.put_batch(batch, mesh))
        out[accum] = (jax.device_get(state.params), jax.device_get(m))
    assert tree_max_abs_diff(out[2][0], out[1][0]) < 1e-6
    np.testing.assert_allclose(out[2][1]["loss"], out[1][1]["loss"], rtol=1e-6)
    np.testing.assert_allclose(out[2][1]["grad_norm"], out[1][1]["grad_norm"], rtol=1e-5)
    assert out[2][1]["tokens"] == out[1][1]["tokens"]


def test_bfloat16_compute_keeps_float32_master_state(setup, fp32_step):
    cfg, mesh, fns, tx, sched = setup
    params0, batch, _, m32, _ = fp32_step
    state = init_state(cfg.model, fns, tx, mesh, seed=0)
    step = jit_train_step(fns, tx, sched, state_shardings(fns, tx, mesh), mesh,
                          compute_dtype="bfloat16")
    state, m = step(state, shd.put_batch(batch, mesh))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))
    assert all(x.dtype in (jnp.float32, jnp.int32) for x in jax.tree.leaves(state.opt_state))
    assert float(m["loss"]) != float(m32["loss"])  # the cast did happen
    np.testing.assert_allclose(float(m["loss"]), float(m32["loss"]), rtol=2e-2)


def test_the_train_step_keeps_block_remat(setup):
    """``jit_train_step(..., remat=...)`` compiles with the options under which the policy holds
    on this backend: the step of a ``block`` model needs far fewer temporaries than no remat."""
    cfg, mesh, _, tx, sched = setup
    temps = {}
    for remat in ("none", "block"):
        m = cfg.model.copy_and_resolve_references()
        m.remat, m.n_layers = remat, 4
        fns = model_fns(m)
        sh = state_shardings(fns, tx, mesh)
        spec = {k: jax.ShapeDtypeStruct((8, 257), np.int32, sharding=shd.batch_sharding(mesh))
                for k in ("tokens", "segment_ids")}
        step = jit_train_step(fns, tx, sched, sh, mesh, remat=remat)
        compiled = step.lower(abstract_state(fns, tx, mesh), spec).compile()
        temps[remat] = compiled.memory_analysis().temp_size_in_bytes
    assert temps["block"] < 0.7 * temps["none"], temps


def test_memory_norms_are_reported_under_remat_and_for_mac(setup):
    """``memory_norm_i``, one per memory layer, come from the state the model's call returns, so
    a remat'ed block and MAC's segment scan report them too (trace-time records were dropped
    in both; one MAC model under block remat has both); they equal the norms of the state
    ``fns.apply`` returns from the same parameters. One layer here; ``fns.memory_norms`` gives one
    norm per memory layer (two layers: tests/models/test_lm.py)."""
    from _backbones import small_model_cfg
    _, mesh, _, tx, sched = setup
    remat = "block"
    m = small_model_cfg("mac", "float32", remat=remat, n_layers=1)
    fns = model_fns(m)
    state = init_state(m, fns, tx, mesh, seed=0)
    params0 = jax.tree.map(jnp.copy, state.params)  # the step donates the state
    batch = random_batch(2, 64, vocab=64)
    step = jit_train_step(fns, tx, sched, state_shardings(fns, tx, mesh), mesh, remat=remat)
    _, metrics = step(state, shd.put_batch(batch, mesh))
    norms = {k: float(v) for k, v in metrics.items() if k.startswith("memory_norm")}
    assert sorted(norms) == ["memory_norm_0"], sorted(metrics)
    x, s = jnp.asarray(batch["tokens"][:, :-1]), jnp.asarray(batch["segment_ids"][:, :-1])
    _, st = jax.jit(fns.apply)(params0, x, s, fns.init_state(params0, 2))
    want = fns.memory_norms(params0, st)
    for i, w in enumerate(want):
        assert 0.1 < norms[f"memory_norm_{i}"] < 10 and norms[f"memory_norm_{i}"] != 1.0
        np.testing.assert_allclose(norms[f"memory_norm_{i}"], float(w), rtol=1e-4)
