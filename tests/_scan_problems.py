"""Float64 problems for the memory engine's tests: random inputs of one ``memory_scan`` call and a
random linear functional of its outputs (for gradients and meta-gradients)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from titans_lm.memory import MLPMemory

# Tiny programs: skip LLVM's expensive optimisations, compile time dominates these tests.
FAST_COMPILE = {"xla_backend_optimization_level": 0}

def problem(model, T, d=4, seed=0, theta_max=0.2):
    """float64 inputs: unit-norm keys and queries, random gates, non-zero initial momentum."""
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    params0 = model.init(jax.random.key(seed), d, d, jax.dtypes.canonicalize_dtype(jnp.float64))
    momentum0 = tuple(0.05 * jnp.asarray(rng.normal(size=p.shape)) for p in params0)
    k, q = (jnp.asarray(unit(rng.normal(size=(T, d)))) for _ in range(2))
    v = jnp.asarray(rng.normal(size=(T, d)))
    theta = jnp.asarray(rng.uniform(0.0, theta_max, T))
    eta = jnp.asarray(rng.uniform(0.0, 1.0, T))
    alpha = jnp.asarray(rng.uniform(0.0, 0.05, T))
    return params0, momentum0, k, v, q, theta, eta, alpha


def functional(seed, T, params0):
    """Random weights of a linear functional of (reads, params_T, momentum_T)."""
    rng = np.random.default_rng(seed)
    d_v = params0[-1].shape[-1]
    return (jnp.asarray(rng.normal(size=(T, d_v))),
            tuple(jnp.asarray(rng.normal(size=p.shape)) for p in params0),
            tuple(jnp.asarray(rng.normal(size=p.shape)) for p in params0))


@functools.cache
def small_memory(depth):
    """The inner model of depth 1 ("linear") or 2 (an MLP with 1.5x expansion)."""
    return "linear" if depth == 1 else MLPMemory(depth=2, expansion=1.5)


def documents_problem(T, d, starts, seed=0, decay=0.2):
    """float64 ((k, v, q, theta, eta, log_keep), reset [T] bool): stable writes (theta < 0.05),
    the forget gate in log form (log_keep in (-decay, 0]), documents starting at ``starts``."""
    rng = np.random.default_rng(seed)
    k, v, q = (jnp.asarray(rng.normal(size=(T, d))) for _ in range(3))
    theta = jnp.asarray(0.05 * rng.random(T))   # a stable write: reads stay O(1)
    eta = jnp.asarray(0.9 * rng.random(T))
    log_keep = jnp.asarray(-decay * rng.random(T))
    reset = np.zeros(T, bool)
    reset[list(starts)] = True
    return (k, v, q, theta, eta, log_keep), jnp.asarray(reset)


def assert_chunked_equals_reference(value, diff_args, cases, names, seed):
    """For each case, ``value(impl, case)`` -> ``f(*diff_args) -> (reads [T, d_v], P)``; a random
    linear functional of (reads, P) (weights from ``seed``) and its gradients with respect to every
    one of ``diff_args`` (leaves named by ``names``) agree between "chunked" and "reference": reads
    and state to 1e-10, gradients to 1e-9 of their scale. Reads above 10 fail (a divergence is not
    what is tested)."""
    rng = np.random.default_rng(seed)
    T = diff_args[-1].shape[0]
    d_v = diff_args[0][-1].shape[-1]
    w_reads = jnp.asarray(rng.normal(size=(T, d_v)))
    w_state = tuple(jnp.asarray(rng.normal(size=p.shape)) for p in diff_args[0])

    def objective(impl, case):
        def v(*args):
            reads, P = value(impl, case)(*args)
            return (jnp.sum(reads * w_reads) + sum(jnp.sum(p * w) for p, w in zip(P, w_state)),
                    (reads, P))
        return jax.jit(jax.value_and_grad(v, argnums=tuple(range(len(diff_args))), has_aux=True))

    for case in cases:
        (_, (want_reads, want_P)), want_g = objective("reference", case)(*diff_args)
        (_, (got_reads, got_P)), got_g = objective("chunked", case)(*diff_args)
        assert float(jnp.max(jnp.abs(want_reads))) < 10   # the test is not of a divergence
        np.testing.assert_allclose(got_reads, want_reads, rtol=0, atol=1e-10)
        for a, b in zip(got_P, want_P):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)
        for what, a, b in zip(names, jax.tree.leaves(got_g), jax.tree.leaves(want_g)):
            scale = max(1.0, float(jnp.max(jnp.abs(b))))
            assert float(jnp.max(jnp.abs(a - b))) < 1e-9 * scale, (case, what)
