"""Remat policies by name: every policy computes the loss and gradients of no remat (float64), with
the recomputation kept in the compiled program (the CPU compiler options), where it shows in
XLA's memory estimate."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from _backbones import build, small_model_cfg
from titans_lm.models.remat import POLICIES, REMAT_MODES, check_remat, compiler_options


def _compiled_grad(name, remat, T=40, B=1, dtype="float64", **changes):
    """(compiled value_and_grad of a mean-square loss, params, tokens, segments), compiled with
    the options under which ``remat`` holds on the CPU."""
    m = build(small_model_cfg(name, remat=remat, dtype=dtype, **changes), seed=1)
    gdef, params, rest = nnx.split(m, nnx.Param, ...)
    tok = jax.random.randint(jax.random.key(0), (B, T), 4, 64)
    seg = jnp.ones_like(tok)

    def loss(p, tok, seg):
        return jnp.mean(nnx.merge(gdef, p, rest)(tok, seg) ** 2)

    fn = jax.jit(jax.value_and_grad(loss)).lower(params, tok, seg).compile(
        compiler_options(remat, "cpu"))
    return fn, params, tok, seg


def _loss_and_grads(name, remat):
    # one layer: a policy acts inside each block alike, and compiling a second doubles the cost
    fn, *args = _compiled_grad(name, remat, n_layers=1)
    return fn(*args)


_BASE = {}  # name -> no remat's (loss, grads), computed once per worker


# "full" is "block"'s policy; "dots" is JAX's dots_saveable through the same call as "minimal"
# (a policy only chooses what the backward keeps: saving none and saving some are the two cases)
@pytest.mark.parametrize("remat", ["block", "minimal"])
@pytest.mark.parametrize("name", ["lmm"])
def test_every_policy_matches_no_remat(name, remat):
    assert POLICIES["full"] is POLICIES["block"]
    with jax.enable_x64(True):
        if name not in _BASE:
            _BASE[name] = _loss_and_grads(name, "none")
        base_loss, base_grads = _BASE[name]
        loss, grads = _loss_and_grads(name, remat)
        np.testing.assert_allclose(loss, base_loss, rtol=1e-12)
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(base_grads)):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_unknown_policy_names_the_valid_ones():
    with pytest.raises(ValueError, match="model remat must be one of .*'minimal'"):
        check_remat("everything")
    with pytest.raises(ValueError, match="model.remat: must be .*'minimal'"):
        build(small_model_cfg("lmm", remat="everything"))


def test_compiler_options_keep_the_barriers_on_cpu_only():
    assert compiler_options("none", "cpu") is None
    assert compiler_options("block", "gpu") is None
    for name in REMAT_MODES[1:]:
        assert compiler_options(name, "cpu") == {"xla_disable_hlo_passes": "cse_barrier_expander"}
    with pytest.raises(ValueError, match="model remat"):
        compiler_options("everything", "cpu")


@pytest.mark.parametrize("name", ["transformer"])
def test_block_remat_shows_in_the_cpu_memory_estimate(name):
    """Under ``block`` the backward keeps each block's input only: the compiled program's
    temporaries fall well below no remat's (on CPU, only with :func:`compiler_options`)."""
    def temp(remat):
        fn, *_ = _compiled_grad(name, remat, T=256, B=4, dtype="float32", n_layers=4)
        return fn.memory_analysis().temp_size_in_bytes

    none, block = temp("none"), temp("block")
    assert block < 0.6 * none, (block, none)
