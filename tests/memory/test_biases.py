"""MIRAS' attentional biases l_p and Huber (titans_lm/memory/biases.py), in float64:

- each bias's dl/dy equals jax.grad of its loss and central finite differences, and has a finite
  derivative itself (the outer gradient differentiates it), zero residuals included;
- l_p with p = 2 is the l2 bias, Huber with a delta beyond every residual is the l2 bias, and
  Huber is quadratic (l2) on residuals within delta;
- the chunked engine equals the reference token loop for each bias at memory depth 1 and 2,
  chunk sizes 1, 4, 16, with documents starting inside chunks: reads, final state and the
  gradients of every input (W0, k, v, q, and the gates theta, eta and the forget gate);
- the layer passes its bias parameters to the engine;
- bad values get one clear message.
"""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from titans_lm.memory import memory_scan
from titans_lm.memory.biases import AttentionalBias, get_bias
from titans_lm.memory.config import MemoryConfig
from titans_lm.memory.layer import NeuralMemory
from _memory_call import call_fresh
from _scan_problems import assert_chunked_equals_reference, documents_problem, small_memory

T, D = 21, 4
STARTS = (6, 13, 14)   # document starts inside chunks of 4 and 16

BIASES = {"lp1.5": get_bias("lp", p=1.5), "lp3": get_bias("lp", p=3.0),
          "huber": get_bias("huber", delta=0.3)}


def residual_points():
    """y with residuals of both signs, small and large, and exact zeros (r = 0)."""
    rng = np.random.default_rng(0)
    v = rng.normal(size=(3, 5))
    y = v + rng.normal(size=(3, 5)) * np.array([0.05, 0.2, 1.0, 2.0, 0.0])
    return jnp.asarray(y), jnp.asarray(v)


@pytest.mark.parametrize("name", ["l2", "dot", *BIASES])
def test_derivative_is_the_gradient_of_the_loss(name):
    with jax.enable_x64(True):
        bias = BIASES.get(name) or get_bias(name)
        y, v = residual_points()
        grad = bias.grad(y, v)
        np.testing.assert_allclose(jax.grad(bias.loss)(y, v), grad, rtol=1e-12, atol=1e-14)
        h = 1e-6
        for idx in [(0, 0), (1, 2), (2, 3), (2, 4)]:   # (., 4): a zero residual
            e = jnp.zeros_like(y).at[idx].set(h)
            fd = (bias.loss(y + e, v) - bias.loss(y - e, v)) / (2 * h)
            assert abs(float(fd - grad[idx])) < 1e-6, (idx, float(fd), float(grad[idx]))
        # the outer gradient differentiates dl/dy again: finite everywhere, at r = 0 too
        second = jax.jacfwd(lambda y_: bias.grad(y_, v).sum(axis=0))(y)
        assert bool(jnp.all(jnp.isfinite(second)))


def test_lp_with_p_2_is_l2_and_huber_is_l2_within_delta():
    with jax.enable_x64(True):
        y, v = residual_points()
        l2 = get_bias("l2")
        for same in (get_bias("lp", p=2.0), get_bias("huber", delta=1e30)):
            np.testing.assert_array_equal(same.grad(y, v), l2.grad(y, v))
            np.testing.assert_allclose(same.loss(y, v), l2.loss(y, v), rtol=1e-15)
        small = v + 0.01 * (y - v)          # every residual within delta = 0.3
        huber = get_bias("huber", delta=0.3)
        np.testing.assert_array_equal(huber.grad(small, v), 2 * (small - v))
        np.testing.assert_array_equal(huber.loss(small, v), jnp.sum((small - v) ** 2))
        # beyond delta: linear, 2 delta |r| - delta^2 (Huber's loss times 2)
        np.testing.assert_allclose(huber.loss(jnp.array([2.0]), jnp.array([0.0])), 2 * 0.3 * 2 - 0.09)
        np.testing.assert_array_equal(huber.grad(jnp.array([-2.0]), jnp.array([0.0])), [-0.6])
        # l_p: ||r||_p^p without 1/p, hand-computed at p = 3 (the smoothing e = 1e-3 of |r|
        # moves it by about p/2 e^2 |r|^(p-2))
        lp3 = get_bias("lp", p=3.0)
        np.testing.assert_allclose(lp3.loss(jnp.array([1.0, -2.0]), jnp.zeros(2)), 9.0, rtol=1e-5)
        np.testing.assert_allclose(lp3.grad(jnp.array([1.0, -2.0]), jnp.zeros(2)), [3.0, -12.0],
                                   rtol=1e-5)


def inputs(seed=0):
    return documents_problem(T, D, STARTS, seed)


def run(impl, chunk, bias, depth, params, args, reset):
    k, v, q, theta, eta, log_keep = args
    reads, (P, _) = memory_scan(params, tuple(map(jnp.zeros_like, params)), k, v, q, theta, eta,
                                None, log_keep=log_keep, model=small_memory(depth), chunk_size=chunk,
                                impl=impl, reset=reset, attentional_bias=bias)
    return reads, P


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("name", ["lp1.5", "huber"])   # p = 3: the same code, tested above
def test_chunked_equals_the_token_loop(name, depth):
    bias = BIASES[name]
    with jax.enable_x64(True):
        args, reset = inputs()
        if depth == 1:
            params = (jnp.asarray(np.random.default_rng(1).normal(size=(D, D)) / 2),)
        else:
            params = small_memory(2).init(jax.random.key(0), D, D, jnp.float64)
        assert_chunked_equals_reference(
            lambda impl, chunk: lambda params, *args: run(impl, chunk, bias, depth, params, args,
                                                          reset),
            (params, *args), (1, 4, 16), ("W0", "k", "v", "q", "theta", "eta", "log_keep"), seed=2)


def test_the_layer_passes_its_bias_to_the_engine():
    """A layer with the l_p bias at p = 2 (not bias_p's default, 3) is the l2 layer; with a
    Huber threshold below the residuals it is not."""
    def layer_out(**fields):
        cfg = MemoryConfig(d_model=8, n_heads=2, head_dim=4, chunk_size=4, memory_depth=1,
                           theta_max=0.5, dtype="float64", param_dtype="float64", **fields)
        layer = NeuralMemory(cfg, rngs=nnx.Rngs(0))
        x = jax.random.normal(jax.random.key(1), (1, 8, 8), jnp.float64)
        return call_fresh(layer, x)

    with jax.enable_x64(True):
        l2 = layer_out()
        np.testing.assert_array_equal(layer_out(attentional_bias="lp", bias_p=2.0), l2)
        assert float(jnp.max(jnp.abs(layer_out(attentional_bias="huber", huber_delta=0.01) - l2))) > 1e-6


def test_bad_values_get_one_clear_message():
    with pytest.raises(ValueError, match=r"'lp' needs an exponent p > 1 \(bias_p\), got 1.0"):
        get_bias("lp", p=1.0)
    with pytest.raises(ValueError, match=r"'huber' needs a threshold delta > 0 \(huber_delta\)"):
        get_bias(AttentionalBias("huber", delta=0.0))
    with pytest.raises(ValueError, match="unknown attentional_bias 'l1'"):
        get_bias("l1")
    for fields, match in ((dict(bias_p=0.5), "bias_p: must be a number > 1"),
                          (dict(huber_delta=-1.0), "huber_delta: must be a number > 0"),
                          (dict(attentional_bias="lp", impl="pallas"),
                           "attentional_bias: other than 'l2' is supported by impl 'chunked' and "
                           "'reference' only"),
                          (dict(attentional_bias="huber", gradient_at="previous_token",
                                memory_depth=1, use_momentum=False),
                           "'previous_token' \\(the delta rule\\) needs attentional_bias 'l2'")):
        with pytest.raises(ValueError, match=match):
            MemoryConfig(d_model=8, **fields)
    with jax.enable_x64(True):
        (k, v, q, theta, _, _), _ = inputs()
        W = (jnp.zeros((D, D)),)
        zeros = jnp.zeros(T)
        with pytest.raises(ValueError, match="'chunked' and 'reference' only, not 'pallas'"):
            memory_scan(W, W, k, v, q, theta, zeros, zeros, model="linear", chunk_size=4,
                        impl="pallas", attentional_bias=get_bias("lp", p=3.0))
        with pytest.raises(ValueError, match="previous_token.*'lp'.*needs 'l2'"):
            memory_scan(W, W, k, v, q, theta, zeros, zeros, model="linear", chunk_size=4,
                        gradient_at="previous_token", attentional_bias="lp")
