"""Float64 problems for the memory engine's tests: random inputs of one ``memory_scan`` call and a
random linear functional of its outputs (for gradients and meta-gradients)."""

import jax
import jax.numpy as jnp
import numpy as np

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
