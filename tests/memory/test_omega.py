"""Atlas' Omega rule (titans_lm.memory.omega): the chunked dual form equals the token loop, the
window of 1 is the plain rule, and bad inputs are refused with one message."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from titans_lm.memory import memory_scan
from titans_lm.memory.config import MemoryConfig
from titans_lm.memory.layer import NeuralMemory
from titans_lm.memory.inner_models import resolve_model
from titans_lm.memory.omega import omega_mask
from _memory_call import call_fresh
from _scan_problems import (FAST_COMPILE, assert_chunked_equals_reference, documents_problem,
                            small_memory)

T, D = 13, 3
STARTS = (5, 9)          # document starts inside chunks of 4 (and of 16)
CLIP = 3.0               # the surprise clip, which some tokens' gradients exceed


def omega_problem(depth, window, seed=0):
    """float64 (params0, k, v, q, theta, eta, log_keep, gamma), reset, and a window tail with a
    valid and an invalid token (c - 1 tokens before token 0)."""
    model = small_memory(depth)
    (k, v, q, theta, eta, log_keep), reset = documents_problem(T, D, STARTS, seed=seed)
    rng = np.random.default_rng(seed + 1)
    params0 = tuple(resolve_model(model).init(jax.random.key(seed), D, D, jnp.float64))
    gamma = jnp.asarray(rng.uniform(0.0, 1.0, T))
    n = window - 1
    tail = (jnp.asarray(rng.normal(size=(n, D))), jnp.asarray(rng.normal(size=(n, D))),
            jnp.asarray(rng.uniform(0.0, 1.0, n)), jnp.asarray(np.arange(n) >= n // 2))
    return model, (params0, k, v, q, theta, eta, log_keep, gamma), reset, tail


# memory depth -> cases (chunk size, window, state_length, options): chunk sizes 1, 4 and 16 at
# c = 3, c = 6 > the chunk of 4 at both depths, the state inside a chunk (the carried-state path),
# TTT's running-mean reads, the chunk-start read, the decay toward the initial state and Atlas'
# whole write (the window's sum into the Newton-Schulz momentum); the window's mean
# (omega_normalize) at both depths, across chunks and a carried tail
CASES = {1: [(1, 3, None, {}), (16, 3, None, dict(running_mean=True)),
             (4, 6, None, dict(read="chunk_start")), (4, 6, None, dict(omega_normalize=True))],
         2: [(4, 3, 10, {}), (4, 6, None, dict(decay_target="initial")),
             (4, 6, 10, dict(ns_steps=5)),
             (1, 3, 10, dict(omega_normalize=True, decay_target="initial"))]}


@pytest.mark.parametrize("depth", [1, 2])
def test_chunked_equals_reference(depth):
    """Reads, state and gradients wrt every input agree to 1e-10, with documents starting inside
    chunks, a carried tail and the surprise clip on some tokens."""
    cases = CASES[depth]

    def value(impl, case):
        b, c, length, options = case
        model, _, reset, tail = omega_problem(depth, c)

        def f(params0, k, v, q, theta, eta, log_keep, gamma):
            momentum0 = tuple(0.05 * jnp.ones_like(p) for p in params0)
            reads, (P, _) = memory_scan(params0, momentum0, k, v, q, theta, eta, None,
                                        log_keep=log_keep, model=model, chunk_size=b, impl=impl,
                                        reset=reset, omega_window=c, gamma=gamma,
                                        omega_tail=tail, state_length=length,
                                        surprise_max_norm=CLIP, **options)
            return reads, P
        return f

    with jax.enable_x64(True):
        _, args, _, _ = omega_problem(depth, 3)
        assert_chunked_equals_reference(value, args, cases, ("W0",) * len(args[0]) + (
            "k", "v", "q", "theta", "eta", "log_keep", "gamma"), seed=depth)


def test_window_of_one_is_the_plain_rule():
    """omega_window = 1 takes no gamma and gives the plain engine's numbers bitwise."""
    with jax.enable_x64(True):
        model, (params0, k, v, q, theta, eta, log_keep, _), reset, _ = omega_problem(2, 2)
        zeros = tuple(jnp.zeros_like(p) for p in params0)
        for impl in ("chunked", "reference"):
            run = functools.partial(memory_scan, params0, zeros, k, v, q, theta, eta, None,
                                    log_keep=log_keep, model=model, chunk_size=4, reset=reset,
                                    impl=impl)
            plain, one = run(), run(omega_window=1)
            for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(one)):
                np.testing.assert_array_equal(a, b)


def test_full_gates_in_one_document_sum_the_window():
    """The mask of one chunk: gamma on the band s..s + c - 1 (extended positions) within the
    document, exact zeros elsewhere."""
    c, b = 3, 4
    gamma = jnp.arange(1, b + c) / 10.0
    doc = jnp.asarray([-1, 0, 0, 0, 1, 1])        # invalid tail token, valid one, a start at 2
    W = np.asarray(omega_mask(gamma, doc, c))
    want = np.zeros((b, b + c - 1))
    for s in range(b):
        for j in range(s, s + c):
            if doc[j] == doc[s + c - 1]:
                want[s, j] = gamma[j]
    np.testing.assert_array_equal(W, want)
    assert W[0, 0] == 0 and W[0, 1] > 0 and W[2, 3] == 0   # the invalid tail, the start


def test_normalized_mask_rows_are_the_windows_mean():
    """omega_normalize: each row is the plain row over its sum (weights of a mean, summing to 1);
    a row whose gates are all 0 stays exactly 0 and its gradient finite."""
    c, b = 3, 4
    gamma = jnp.asarray([0.0, 0.0, 0.0, 0.5, 0.2, 0.9])
    doc = jnp.asarray([0, 0, 0, 0, 1, 1])          # token 0's window: three zero gates
    plain = np.asarray(omega_mask(gamma, doc, c))
    mean = np.asarray(omega_mask(gamma, doc, c, normalize=True))
    np.testing.assert_array_equal(mean[0], 0.0)
    for s in range(1, b):
        np.testing.assert_allclose(mean[s], plain[s] / plain[s].sum(), rtol=1e-6)
        np.testing.assert_allclose(mean[s].sum(), 1.0, rtol=1e-6)
    grad = jax.grad(lambda g: jnp.sum(omega_mask(g, doc, c, normalize=True) ** 2))(gamma)
    assert np.all(np.isfinite(grad))


@pytest.mark.parametrize("kwargs, match", [
    (dict(omega_window=0), "omega_window must be an int >= 1"),
    (dict(omega_window=3), "needs gamma"),
    (dict(gamma=jnp.ones(T)), "gamma is an input of the Omega rule only"),
    (dict(omega_window=3, gamma=2 * jnp.ones(T)), r"gamma must be in \[0, 1\]"),
    (dict(omega_window=3, gamma=jnp.ones(T), omega_tail=(jnp.ones((1, D)),) * 2
          + (jnp.ones(1), jnp.ones(1, bool))), "omega_tail's k must be"),
    (dict(omega_window=3, gamma=jnp.ones(T), gradient_at="previous_token"),
     "gradient_at='previous_token' is not implemented"),
    (dict(omega_normalize=True), "omega_normalize=True normalises the Omega window's sum"),
])
def test_bad_omega_inputs_are_refused(kwargs, match):
    with jax.enable_x64(True):
        model, (params0, k, v, q, theta, eta, log_keep, _), _, _ = omega_problem(1, 2)
        with pytest.raises(ValueError, match=match):
            memory_scan(params0, params0, k, v, q, theta, 0 * eta, None, log_keep=log_keep,
                        model=model, chunk_size=4, **kwargs)


@pytest.mark.parametrize("normalize", [False, True], ids=["sum", "mean"])
def test_gamma_bias_gradient_equals_finite_differences(normalize):
    """The layer's gamma gate is trained by the outer loss: d(loss)/d(gamma_b) by autodiff equals
    central differences (float64, a window of 3 over chunks of 4, two documents), for the
    window's sum and its mean (``omega_normalize``, which changes the layer's output)."""
    with jax.enable_x64(True):
        make = lambda norm: NeuralMemory(MemoryConfig(  # noqa: E731
            d_model=8, n_heads=2, head_dim=4, chunk_size=4, memory_expansion=2.0, omega_window=3,
            omega_normalize=norm, dtype="float64", param_dtype="float64", theta_max=0.5,
            alpha_bias_init=-2.0), rngs=nnx.Rngs(0))
        graphdef, bias, rest = nnx.split(make(normalize), nnx.PathContains("gamma_b"), ...)
        x = jax.random.normal(jax.random.key(1), (1, 10, 8), jnp.float64)
        seg = jnp.asarray([[1] * 6 + [2] * 4])
        if normalize:
            other = call_fresh(make(False), x, seg)
            assert float(jnp.max(jnp.abs(call_fresh(make(True), x, seg) - other))) > 1e-4

        def loss(gamma_b):
            with_b = jax.tree.map(lambda _: gamma_b, bias)
            return jnp.sum(jnp.sin(call_fresh(nnx.merge(graphdef, with_b, rest), x, seg)))

        b0 = jax.tree.leaves(bias)[0]
        grad = jax.jit(jax.grad(loss), compiler_options=FAST_COMPILE)(b0)
        loss = jax.jit(loss, compiler_options=FAST_COMPILE)
        eps = 1e-6
        for h in range(2):
            e = jnp.zeros_like(b0).at[h].set(eps)
            fd = (loss(b0 + e) - loss(b0 - e)) / (2 * eps)
            assert abs(float(fd)) > 1e-4                 # gamma matters
            assert abs(float(grad[h]) - float(fd)) < 1e-7 * max(1.0, abs(float(fd)))


def test_pallas_runs_chunked_for_it():
    """The kernel has no window: impl "pallas" gives "chunked"'s numbers (a logged fallback)."""
    with jax.enable_x64(True):
        model, (params0, k, v, q, theta, eta, log_keep, gamma), reset, tail = omega_problem(1, 3)
        run = functools.partial(memory_scan, params0, params0, k, v, q, theta, eta, None,
                                log_keep=log_keep, model=model, chunk_size=4, reset=reset,
                                omega_window=3, gamma=gamma, omega_tail=tail)
        for a, b in zip(jax.tree.leaves(run(impl="pallas")), jax.tree.leaves(run())):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("fields, match", [
    (dict(omega_window=0), "omega_window: must be an int >= 1"),
    (dict(omega_window=2, gradient_at="previous_token", memory_depth=1, use_momentum=False),
     "omega_window: > 1 .* needs gradient_at 'chunk_start'"),
    (dict(omega_normalize=True), "omega_normalize: normalises the Omega window's sum: it needs "
                                 "omega_window > 1"),
])
def test_bad_omega_configs_are_refused(fields, match):
    with pytest.raises(ValueError, match=match):
        MemoryConfig(d_model=8, **fields)
