"""Remat policies by name: every policy computes the loss and gradients of no remat (float64)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from _backbones import build, small_model_cfg
from titans_lm.models.remat import REMAT_MODES, check_remat


def _loss_and_grads(name, remat):
    m = build(small_model_cfg(name, remat=remat), seed=1)
    gdef, params, rest = nnx.split(m, nnx.Param, ...)
    tok = jax.random.randint(jax.random.key(0), (1, 40), 4, 64)
    seg = jnp.ones_like(tok)

    def loss(p):
        return jnp.mean(nnx.merge(gdef, p, rest)(tok, seg) ** 2)

    return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize("name", ["lmm"])
def test_every_policy_matches_no_remat(name):
    with jax.enable_x64(True):
        base_loss, base_grads = _loss_and_grads(name, "none")
        for remat in REMAT_MODES[1:]:
            loss, grads = _loss_and_grads(name, remat)
            np.testing.assert_allclose(loss, base_loss, rtol=1e-12)
            for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(base_grads)):
                np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_unknown_policy_names_the_valid_ones():
    with pytest.raises(ValueError, match="model remat must be one of .*'minimal'"):
        check_remat("everything")
    with pytest.raises(ValueError, match="model remat"):
        build(small_model_cfg("lmm", remat="everything"))
