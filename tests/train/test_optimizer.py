"""AdamW with masked decay, warmup + cosine schedule, clipping."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from _tiny_run import tiny_config
from titans_lm.train.optimizer import decays, make_optimizer, make_schedule, weight_decay_mask
from titans_lm.train.state import model_fns


def _optim(**kw):
    c = ml_collections.ConfigDict(dict(lr=1e-2, end_lr_ratio=0.1, warmup_steps=4, b1=0.9, b2=0.95,
                                       eps=1e-8, weight_decay=0.1, clip_norm=1.0))
    c.update(kw)
    return c


def test_schedule_warmup_then_cosine_to_end_ratio():
    sched = make_schedule(_optim(), total_steps=20)
    lrs = np.array([float(sched(s)) for s in range(20)])
    np.testing.assert_allclose(lrs[:4], 1e-2 * np.arange(1, 5) / 4, rtol=1e-6)  # first update > 0
    assert np.all(np.diff(lrs[3:]) < 0)  # cosine decay after the peak
    np.testing.assert_allclose(lrs[-1], 1e-3, rtol=1e-5)  # the last update uses lr * end_lr_ratio
    # the cosine between: lr_end + (peak - lr_end) * (1 + cos(pi * k / 16)) / 2
    k = np.arange(17)  # updates 3..19 are cosine steps 0..16 of 16
    np.testing.assert_allclose(lrs[3:], 1e-3 + 9e-3 * (1 + np.cos(np.pi * k / 16)) / 2, rtol=1e-5)


def test_decay_mask_on_the_transformer(tmp_path):
    fns = model_fns(tiny_config(tmp_path).model)
    mask = weight_decay_mask(fns.abstract_params())
    flat = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(mask)[0]}
    assert flat["['embed']['embedding']"] is False
    assert flat["['final_norm']['scale']"] is False
    assert flat["['blocks'][0]['mixer_norm']['scale']"] is False
    for name in ("['mixer']['w_q']", "['mixer']['w_o']", "['mlp']['w_gate']", "['mlp']['w_down']"):
        assert flat[f"['blocks'][1]{name}"] is True
    key = jax.tree_util.DictKey
    assert not decays((key("mem"), key("theta_proj")), jnp.zeros((4, 4)))  # memory gates
    assert not decays((key("mlp"), key("bias")), jnp.zeros((4, 4)))
    assert decays((key("conv"), key("w")), jnp.zeros((4, 4)))


def test_decoupled_weight_decay_and_clipping():
    tx, _ = make_optimizer(_optim(warmup_steps=0, lr=0.1, weight_decay=0.5), total_steps=10)
    params = {"w": jnp.ones((2, 2)), "embed": jnp.ones((2, 2)), "b": jnp.ones((2,))}
    zero = jax.tree.map(jnp.zeros_like, params)
    upd, _ = tx.update(zero, tx.init(params), params)
    lr0 = 0.1 * (0.1 + 0.9 * (1 + np.cos(np.pi / 10)) / 2)
    np.testing.assert_allclose(upd["w"], -lr0 * 0.5 * np.ones((2, 2)), rtol=1e-5)  # decay only
    np.testing.assert_allclose(upd["embed"], 0.0)
    np.testing.assert_allclose(upd["b"], 0.0)
    # clipping: a gradient of norm 100 is scaled to norm 1 before Adam (same direction)
    tx2 = optax.chain(optax.clip_by_global_norm(1.0))
    g = {"w": jnp.full((2, 2), 50.0), "embed": jnp.zeros((2, 2)), "b": jnp.zeros((2,))}
    clipped, _ = tx2.update(g, tx2.init(params))
    np.testing.assert_allclose(optax.tree.norm(clipped), 1.0, rtol=1e-6)
    tx3, _ = make_optimizer(_optim(clip_norm=0.0), total_steps=10)
    assert len(tx3.init(params)) == 1  # clip_norm <= 0: no clipping stage
