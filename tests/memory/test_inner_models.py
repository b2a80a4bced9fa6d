"""Inner models: layouts, initial parameters, forward definitions, validation messages."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from titans_lm.memory.inner_models import (LinearMemory, MLPMemory, ResidualLN, make_inner_model,
                                           resolve_model)


def test_linear_layout_and_forward():
    m = LinearMemory(bias=True)
    W, b = m.init(jax.random.key(0), 3, 5)
    assert W.shape == (3, 5) and b.shape == (5,) and np.all(np.asarray(b) == 0)
    x = jax.random.normal(jax.random.key(1), (4, 3))
    np.testing.assert_allclose(m.apply((W, b), x), x @ W + b, rtol=1e-6)
    assert m.check_params((W, b)) == (3, 5)


@pytest.mark.parametrize("depth", [2, 3, 4])
@pytest.mark.parametrize("bias", [False, True])
def test_mlp_layout_and_forward(depth, bias):
    m = MLPMemory(depth=depth, expansion=2.0, activation="gelu", bias=bias)
    params = m.init(jax.random.key(0), 3, 5)
    assert len(params) == depth * (2 if bias else 1)
    mats = [p for p in params if p.ndim == 2]
    assert [p.shape for p in mats] == [(3, 6)] + [(6, 6)] * (depth - 2) + [(6, 5)]
    x = jax.random.normal(jax.random.key(1), (4, 3))
    h = x
    stride = 2 if bias else 1
    for layer in range(depth):
        h = h @ params[layer * stride] + (params[layer * stride + 1] if bias else 0)
        if layer < depth - 1:
            h = jax.nn.gelu(h, approximate=False)
    np.testing.assert_allclose(m.apply(params, x), h, rtol=1e-5, atol=1e-6)
    assert m.check_params(params) == (3, 5)


def test_residual_ln_is_x_plus_layernorm():
    m = ResidualLN(MLPMemory(depth=2, expansion=1.5))
    params = m.init(jax.random.key(0), 4, 4)
    scale = jnp.array([1.0, 2.0, 0.5, -1.0])
    shift = jnp.array([0.1, 0.0, -0.2, 0.3])
    params = params[:2] + (scale, shift)
    x = jax.random.normal(jax.random.key(1), (3, 4))
    g = jax.nn.silu(x @ params[0]) @ params[1]
    normed = (g - g.mean(-1, keepdims=True)) / jnp.sqrt(g.var(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(m.apply(params, x), x + normed * scale + shift, rtol=1e-5, atol=1e-6)
    init = m.init(jax.random.key(0), 4, 4)
    assert np.all(np.asarray(init[2]) == 1) and np.all(np.asarray(init[3]) == 0)


def test_loss_has_no_half():
    m = LinearMemory()
    W = jnp.array([[2.0]])
    assert float(m.loss((W,), jnp.array([[1.0]]), jnp.array([[5.0]]))) == 9.0


def test_shorthands_and_factory():
    assert resolve_model("linear") == LinearMemory()
    assert resolve_model("mlp") == MLPMemory(depth=2, activation="silu", bias=False)
    assert make_inner_model(1) == LinearMemory()
    assert make_inner_model(3, expansion=2.0, activation="gelu") == MLPMemory(3, 2.0, "gelu")
    assert make_inner_model(2, residual_ln=True) == ResidualLN(MLPMemory(2))
    # "mlp" takes its sizes from the parameters: any hidden width works.
    params = (jnp.zeros((3, 7)), jnp.zeros((7, 2)))
    assert resolve_model("mlp").check_params(params) == (3, 2)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="unknown inner model"):
        resolve_model("conv")
    with pytest.raises(ValueError, match="depth must be in 2..4"):
        MLPMemory(depth=5)
    with pytest.raises(ValueError, match="activation"):
        MLPMemory(activation="relu6")
    with pytest.raises(ValueError, match="memory depth must be in 1..4"):
        make_inner_model(0)
    with pytest.raises(ValueError, match="expected 2 parameter arrays"):
        MLPMemory().check_params((jnp.zeros((3, 4)),))
    with pytest.raises(ValueError, match=r"parameter 1 must be a matrix of shape \[4, \*\]"):
        MLPMemory().check_params((jnp.zeros((3, 4)), jnp.zeros((5, 3))))
    with pytest.raises(ValueError, match="needs d_in == d_out"):
        ResidualLN(LinearMemory()).param_shapes(3, 4)
    with pytest.raises(ValueError, match=r"parameter 1 must be a vector of shape \[4\]"):
        LinearMemory(bias=True).check_params((jnp.zeros((3, 4)), jnp.zeros((3,))))
